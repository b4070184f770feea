"""Fuzz: generated grammars and JSON schemas, run through the path every request takes
(edgespec.grammar.constraint.constraint_of: bounds, conversion, llama.cpp's parser), in a
child process and a thread with only STACK_FLOOR bytes of stack. Each case must be accepted
or refused with an EdgespecError: a crash (the child dies) or any other exception fails.

Bounded time (a few seconds in `make test`): one child for the module, a few dozen cases
per strategy, and the counts that matter (around each limit, and far over) drawn often.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec.grammar.bounds import LIMITS, STACK_FLOOR

_WORKER = textwrap.dedent(f"""
    import json, sys, threading, traceback
    from edgespec.errors import EdgespecError
    from edgespec.grammar.constraint import constraint_of
    threading.stack_size({STACK_FLOOR})

    def one(case, out):
        try:
            constraint_of(**case)
            out.append("ok")
        except EdgespecError as e:
            out.append("refused " + type(e).__name__)
        except BaseException:
            out.append("bug " + traceback.format_exc())

    for line in sys.stdin:
        out = []
        t = threading.Thread(target=one, args=(json.loads(line), out))
        t.start(); t.join()
        print(json.dumps(out[0]), flush=True)
""")


class _Worker:
    """A child process checking one case per line; restarted after a crash."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def check(self, case: dict) -> str:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise AssertionError(f"the process died (rc {rc}) on {json.dumps(case)[:300]}")
        verdict = json.loads(line)
        assert not verdict.startswith("bug"), f"{verdict}\ncase: {json.dumps(case)[:300]}"
        return verdict

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker():
    w = _Worker()
    yield w
    w.close()


_FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])

# counts around every limit and far over, and small ones
_COUNT = st.one_of(st.integers(0, 12), st.sampled_from([
    LIMITS.max_schema_repeat, LIMITS.max_schema_repeat + 1, LIMITS.max_repeat,
    LIMITS.max_repeat + 1, LIMITS.max_depth, LIMITS.max_depth + 1, 20000, 10 ** 7]))


# --- GBNF ----------------------------------------------------------------------------------
def _rep(count_lo: int, count_hi: int, kind: int) -> str:
    return ["", "*", "+", "?", f"{{{count_lo}}}", f"{{{count_lo},}}",
            f"{{{min(count_lo, count_hi)},{max(count_lo, count_hi)}}}"][kind]


_ATOM = st.one_of(st.sampled_from(['"a"', '"bc"', "[a-z]", "[^\\n]", ".", "r0", "r1", "r2"]),
                  st.text("ab(|)\\", max_size=4).map(lambda t: json.dumps(t)))
_EXPR = st.recursive(
    _ATOM,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4).map(" ".join),
        st.lists(inner, min_size=2, max_size=4).map(" | ".join),
        st.tuples(inner, _COUNT, _COUNT, st.integers(0, 6)).map(
            lambda t: f"({t[0]}){_rep(t[1], t[2], t[3])}"),
        st.tuples(inner, st.sampled_from([2, 50, LIMITS.max_depth, LIMITS.max_depth + 1,
                                          5000])).map(lambda t: "(" * t[1] + t[0] + ")" * t[1]),
    ),
    max_leaves=12)


@st.composite
def _grammars(draw) -> str:
    rules = [f"root ::= {draw(_EXPR)}"] + [f"r{i} ::= {draw(_EXPR)}" for i in range(3)]
    chain = draw(st.integers(0, 20))  # a0 ::= a1 | a1 "x" ...: 2^n parse stacks
    if chain:
        rules[0] += " a0"
        rules += [f'a{i} ::= a{i + 1} | a{i + 1} "x"' for i in range(chain)] + [f'a{chain} ::= "z"']
    return "\n".join(rules) + "\n"


@_FUZZ
@given(text=st.one_of(_grammars(), st.text('()|"[]{},*+?.:=ab0129 \n#\\-^', max_size=200)
                      .map(lambda t: "root ::= " + t)))
def test_generated_grammars_are_accepted_or_refused(worker, text):
    worker.check({"grammar": text})


# --- JSON schemas --------------------------------------------------------------------------
_PATTERN = st.tuples(st.sampled_from(["a", "[a-z]", "(ab|c)", "\\d"]), _COUNT, _COUNT,
                     st.integers(0, 6)).map(lambda t: f"^{t[0]}{_rep(t[1], t[2], t[3])}$")
_LEAF = st.one_of(
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"maxLength": _COUNT, "minLength": _COUNT}),
    st.builds(lambda p: {"type": "string", "pattern": p}, _PATTERN),
    st.builds(lambda lo, hi: {"type": "integer", "minimum": lo, "maximum": lo + hi},
              st.integers(-10 ** 9, 10 ** 9), st.integers(0, 10 ** 9)),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.text(max_size=8), min_size=1, max_size=5)),
    st.sampled_from([{"type": "boolean"}, {"type": "number"}, {"type": "null"}, {}]),
)
_SCHEMA = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.dictionaries(st.text("abcxyz", min_size=1, max_size=6), inner, min_size=1,
                        max_size=5).map(lambda p: {"type": "object", "properties": p,
                                                   "required": sorted(p)[:1]}),
        st.builds(lambda it, lo, hi: {"type": "array", "items": it, "minItems": min(lo, hi),
                                      "maxItems": max(lo, hi)}, inner, _COUNT, _COUNT),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: {"anyOf": xs}),
    ),
    max_leaves=10)


@_FUZZ
@given(schema=_SCHEMA)
def test_generated_schemas_are_accepted_or_refused(worker, schema):
    worker.check({"json_schema": schema})


def test_the_worker_reports_a_crash(worker):
    """The harness itself: a case that kills the child is a failure, not a pass."""
    w = _Worker()
    w.check({"json_mode": True})
    w.proc.kill()  # type: ignore[union-attr]
    w.proc.wait()  # type: ignore[union-attr]
    w.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with pytest.raises(AssertionError, match="died"):
        w.check({"json_mode": True})
