"""Grammars and schemas are bounded before llama.cpp sees them (issue #43, items 1 and 2).

Each case of the issue crashed or pinned the process before: maxLength 20000 and a pattern
a{0,20000} (SIGSEGV in llama.cpp's recursive parser), 30,000 nested parentheses (the same),
minLength 10**7 (95 MB of grammar text per cached schema), and a chain of rules whose
alternatives start alike (2^n parse stacks: 16 levels took 13 s).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from edgespec.errors import EdgespecError, InvalidInputError
from edgespec.grammar import constraint as C
from edgespec.grammar.bounds import (LIMITS, STACK_FLOOR, GrammarLimits, GrammarTooComplexError,
                                     check_schema, measure_gbnf)
from edgespec.grammar.cache import ByteBudgetCache


def _chain(n: int) -> str:
    """n rules, each opening the next twice: 2^n parse stacks at the start."""
    return ("root ::= a0\n" + "".join(f'a{i} ::= a{i + 1} | a{i + 1} "x"\n' for i in range(n))
            + f'a{n} ::= "a"\n')


def _refused(limit: str, param: str, **kw) -> GrammarTooComplexError:
    with pytest.raises(GrammarTooComplexError) as e:
        C.constraint_of(**kw)
    err = e.value
    assert (err.limit, err.param, err.code) == (limit, param, "grammar_too_complex")
    assert f"{getattr(LIMITS, limit):,}" in str(err) and limit in str(err)
    return err


# --- the issue's cases -------------------------------------------------------------------
@pytest.mark.parametrize("string", [{"maxLength": 20000}, {"maxLength": 100000},
                                    {"minLength": 10 ** 7}, {"pattern": "^a{0,20000}$"}])
def test_schema_repetitions_refused_before_conversion(string):
    schema = {"type": "object", "properties": {"s": {"type": "string", **string}}}
    err = _refused("max_schema_repeat", "json_schema", json_schema=schema)
    assert "/properties/s" in str(err)


def test_deep_parentheses_refused():
    deep = "root ::= " + "(" * 30000 + '"a"' + ")" * 30000 + "\n"
    err = _refused("max_depth", "grammar", grammar=deep)
    assert "nest" in str(err)


def test_exponential_stacks_refused():
    _refused("max_stacks", "grammar", grammar=_chain(16))
    assert C.constraint_of(grammar=_chain(8)) is not None  # 256 stacks: fine


def test_repetition_llama_cpp_would_silently_drop_refused():
    _refused("max_repeat", "grammar", grammar='root ::= "a"{0,5000}\n')
    _refused("max_repeat", "grammar", grammar='root ::= "a"{99999999999999999999}\n')
    assert C.constraint_of(grammar='root ::= "a"{0,2000}\n') is not None


def test_schema_nesting_text_and_names_bounded():
    deep: dict = {}
    node = deep
    for _ in range(200):
        node["items"] = {}
        node = node["items"]
    _refused("max_schema_depth", "json_schema", json_schema=deep)
    _refused("max_schema_depth", "json_schema", json_schema="[" * 100000 + "]" * 100000)
    _refused("max_schema_bytes", "json_schema",
             json_schema={"enum": ["x" * 1000] * 300})
    _refused("max_name_chars", "json_schema",
             json_schema={"type": "object", "properties": {"n" * 300: {"type": "string"}}})
    many = {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": 900} for i in range(30)}}
    _refused("max_schema_expansion", "json_schema", json_schema=many)


def test_every_constraint_is_measured_however_built():
    with pytest.raises(GrammarTooComplexError):
        C.Constraint("grammar", "root ::= " + "(" * 2000 + '"a"' + ")" * 2000)


# --- what realistic grammars cost: accepted with room to spare ----------------------------
def test_realistic_constraints_accepted():
    assert C.constraint_of(json_mode=True) is not None
    at_limit = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": LIMITS.max_schema_repeat},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,32}$"},
                 "maxItems": 20},
        "kind": {"enum": [f"kind-{i}" for i in range(500)]}},
        "required": ["name"]}
    c = C.constraint_of(json_schema=at_limit)
    size = measure_gbnf(c.gbnf)
    assert size.depth >= LIMITS.max_schema_repeat  # the converter's nested groups
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}}
    assert C.constraint_of(json_schema=wide) is not None


def test_measure_models_llama_cpp_expansion():
    s = measure_gbnf('root ::= ("ab" | [a-z])? x{2,5}\nx ::= "q"\n')
    # root: the group's rule + one for `?`; x{2,5}: 3 optional rules
    assert (s.depth, s.rules) == (1, 2 + 1 + 1 + 3)
    # "ab", [a-z], or on to x's "q": 3 stacks; the model is an upper bound that counts the
    # optional group's empty alternative once more
    assert s.stacks == 4
    assert measure_gbnf(_chain(5)).stacks == 32
    assert measure_gbnf("root ::= " + "(" * 40 + '"a"' + ")" * 40).depth == 40
    # comments, strings and classes hide parentheses; a syntax error ends the model there
    assert measure_gbnf('root ::= "((((" [(] # ((((\n').depth == 0


def test_a_tighter_limit_is_honoured():
    tight = GrammarLimits(max_bytes=64)
    with pytest.raises(GrammarTooComplexError, match="max_bytes"):
        measure_gbnf('root ::= "' + "a" * 100 + '"', tight)
    with pytest.raises(GrammarTooComplexError, match="max_schema_repeat"):
        check_schema({"maxItems": 11}, GrammarLimits(max_schema_repeat=10))


def test_bad_text_is_a_clear_error_not_a_crash():
    for bad in ({"grammar": 'root ::= "a"\0 | "b"'}, {"grammar": 'root ::= "\ud800"'},
                {"grammar": {"root": "x"}}, {"json_schema": {"a": object()}}):
        with pytest.raises(InvalidInputError):
            C.constraint_of(**bad)


# --- the C stack: the deepest grammar allowed parses within STACK_FLOOR -------------------
def test_deepest_allowed_grammar_parses_in_a_small_stack():
    """Run in a thread with STACK_FLOOR bytes of stack (a child process: a SIGSEGV there
    fails this test instead of killing pytest). The limits are set so this holds with
    margin; were max_depth raised past what the floor holds, this fails."""
    code = textwrap.dedent(f"""
        import threading
        from edgespec.runtime.grammar_binding import grammar_error
        n = {LIMITS.max_depth}
        grammars = ["root ::= " + "(" * n + '"a"' + ")" * n,
                    "root ::= a0\\n" + "".join(f'a{{i}} ::= a{{i+1}} "x"\\n' for i in range(n))
                    + f'a{{n}} ::= "a"\\n']
        out = []
        threading.stack_size({STACK_FLOOR})
        t = threading.Thread(target=lambda: out.extend(grammar_error(g) for g in grammars))
        t.start(); t.join()
        print(out)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"llama.cpp crashed (rc {run.returncode}): {run.stderr[-500:]}"
    assert run.stdout.strip() == "[None, None]"


# --- the byte budget ----------------------------------------------------------------------
def test_cache_is_bounded_by_bytes_not_count():
    cache: ByteBudgetCache[str, str] = ByteBudgetCache(10_000, lambda k, v: len(k) + len(v))
    for i in range(100):
        cache.put(f"k{i}", "v" * 1000)
    assert cache.bytes <= 10_000 and len(cache) == 8  # 1000 + ~3 + 200 overhead each
    assert cache.get("k99") is not None and cache.get("k0") is None
    cache.put("huge", "v" * 20_000)  # heavier than the whole budget: not kept
    assert cache.get("huge") is None and cache.bytes <= 10_000


def test_compiled_constraints_stay_within_the_budget(monkeypatch):
    cache = ByteBudgetCache(200_000, C._CACHE._weigh)
    monkeypatch.setattr(C, "_CACHE", cache)
    for i in range(40):  # each ~60 KB of schema text and grammar
        C.constraint_of(json_schema={"enum": [f"{i}-{j}-" + "x" * 40 for j in range(600)]})
    assert 0 < cache.bytes <= 200_000 and len(cache) < 40


def test_the_server_answers_400_grammar_too_complex():
    pytest.importorskip("fastapi")
    from edgespec.server.errors import from_edgespec
    with pytest.raises(EdgespecError) as e:
        C.constraint_of(json_schema={"type": "string", "maxLength": 20000})
    api = from_edgespec(e.value)
    assert (api.status, api.code, api.param) == (400, "grammar_too_complex", "json_schema")


# --- the CLI: the same guard, and its numbers bounded (issue #43 item 6) -------------------
def _cli(*args: str):
    from click.testing import CliRunner

    from edgespec.cli import cli
    return CliRunner().invoke(cli, list(args))


def test_cli_refuses_crashing_grammar_and_schema_files(tmp_path):
    deep = tmp_path / "deep.gbnf"
    deep.write_text("root ::= " + "(" * 30000 + '"a"' + ")" * 30000 + "\n")
    schema = tmp_path / "long.json"
    schema.write_text('{"type": "string", "maxLength": 50000}')
    for flag, path, limit in (("--grammar", deep, "max_depth"),
                              ("--json-schema", schema, "max_schema_repeat")):
        r = _cli("generate", "hi", "--target", "nowhere.gguf", flag, str(path))
        assert r.exit_code == 1 and "too complex" in r.output and limit in r.output, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit)


def test_cli_latin1_schema_file_is_a_clear_error(tmp_path):
    f = tmp_path / "latin1.json"
    f.write_bytes('{"type": "string", "description": "café"}'.encode("latin-1"))
    r = _cli("generate", "hi", "--json-schema", str(f))
    assert r.exit_code == 1 and "not UTF-8" in r.output and "0xe9" in r.output, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (("--presence-penalty", "inf"), "not a finite number"),
    (("--frequency-penalty", "nan"), "not a finite number"),
    (("--temperature", "inf"), "not a finite number"),
    (("--threads", "100000"), "CPU cores"),
    (("--threads", "0"), "CPU cores"),
])
def test_cli_numbers_bounded(args, message):
    r = _cli("generate", "hi", *args)
    assert r.exit_code == 2 and message in r.output, r.output


def test_api_numbers_bounded():
    from edgespec.api.params import SamplingParams
    from edgespec.config import EngineConfig
    with pytest.raises(InvalidInputError, match="finite"):
        SamplingParams(presence_penalty=float("inf")).validate()
    with pytest.raises(InvalidInputError, match="CPU cores"):
        EngineConfig(target="x.gguf", threads=100000).validate()


# --- at run time: an ambiguous grammar multiplies llama.cpp's parse stacks ---------------
def test_stack_count_reads_llama_cpp():
    from edgespec.runtime.grammar_binding import _layout
    if not _layout():
        pytest.skip("llama.cpp's grammar structs are not readable on this build")
    from edgespec.runtime import backend
    from edgespec.runtime.grammar_binding import Grammar
    backend.ensure_init()
    for text, want in (('root ::= "a" | "b"', 2), ('root ::= [a-z] | "q" | "r" | "s"', 4)):
        g = Grammar(backend.ll.llama_sampler_init_grammar(None, text.encode(), b"root"))
        assert g.stacks() == want and g.clone().stacks() == want
        g.close()


def test_an_ambiguous_grammar_is_stopped_at_run_time(model_path):
    """Each "a" doubles the stacks (a pending "b" or "c" per "a"); statically the grammar is
    small, so the request is stopped when the stacks pass max_stacks, not at 2^n."""
    from edgespec.grammar.state import GrammarState
    from edgespec.runtime.grammar_binding import _layout
    from edgespec.runtime.model import load_model
    if not _layout():
        pytest.skip("llama.cpp's grammar structs are not readable on this build")
    model = load_model(model_path("smollm2-135m"))
    c = C.constraint_of(grammar='root ::= s\ns ::= "a" s "b" | "a" s "c" | "a"\n')
    a = model.tokenize("a", add_special=False, parse_special=False)
    assert len(a) == 1
    st = GrammarState.open(c, model)
    with pytest.raises(GrammarTooComplexError, match="max_stacks") as e:
        for _ in range(40):
            st.advance(a)
    assert e.value.limit == "max_stacks" and st.accepted <= 13  # 2^13 > 4,096
    st.close()


def test_a_forced_tool_call_schema_is_bounded_before_conversion():
    """A forced call's grammar is converted from the tools' parameter schemas: the same
    bounds, before the converter writes 10**7 characters out."""
    from edgespec.agents.tools import Choice, Tool, call_grammar
    tool = Tool("f", None, {"type": "object", "properties": {
        "s": {"type": "string", "minLength": 10 ** 7}}, "required": ["s"]})
    with pytest.raises(GrammarTooComplexError, match="max_schema_repeat"):
        call_grammar([tool], Choice("required"), "hermes", parallel=False)


def test_an_array_of_anything_is_refused_cleanly():
    """Found by the fuzz: `items: {}` (falsy) was looked up as prefixItems (KeyError, a 500).
    llama-cpp-python's converter has the same slip, so it is refused as unsupported (400)."""
    from edgespec.errors import UnsupportedError
    with pytest.raises(UnsupportedError, match="cannot be turned into a grammar"):
        C.constraint_of(json_schema={"type": "array", "items": {}, "maxItems": 3})
