"""Replay controllers offline on recorded generations (prompt + output) and a cost curve.

The other half of :mod:`edgespec.lab.replay`: :mod:`~edgespec.lab.replay.replay` reproduces a
recorded bench run pass for pass, with the candidates it recorded; this module asks what
*other* controllers or proposers would have done on the same text. Under greedy decoding
the target's output does not depend on how it was speculated, and neither does what a
deterministic proposer drafts at a given position (it only sees the sequence so far). So
one recorded generation plus a proposer function is enough to replay any controller
through the engine's own protocol (:mod:`edgespec.control`): at each step the replay shows
it every free proposer's candidate, cut to the loop's draft limit
(:func:`edgespec.control.limit.draft_limit`), cuts the chosen one to the decided length,
verifies it against the recorded output (:func:`edgespec.lab.replay.accept.matched`), reports
the outcome, and charges ``cal.seconds(d + 1)`` (plus draft-model time) per step. The free
proposers are the shipped ones (:func:`native_proposers`). That makes it cheap to compare
fixed draft lengths with adaptive control on a measured curve without running a model.

    traces = load_traces("traces.jsonl")          # {"name", "category", "prompt", "output"}
    cal = Calibration.prior_cpu()
    table = compare(traces, cal, native_proposers(["ngram"]), standard_configs(cal, ["ngram"]))

:func:`load_traces` also reads a run recorded with ``edgespec bench --record`` (its folder
or its ``traces.jsonl``): each prompt's recorded prompt and output tokens.
``python -m edgespec.lab.replay.generations TRACES`` prints that table, with two bounds: the
foresight controller over the same proposers (:func:`foresight`) and the best any
context-copy proposer could draft (:func:`copy_bound`). Drafts recorded
from a model (a draft model's greedy continuation at each position) can ride
along in a trace's ``drafts`` field and replay through :func:`recorded`.
Ignores what the simulation cannot see: time outside target passes and drafts,
and batch-dependent logits (real runs may verify a near-tie differently).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from ...calibration.curve import Calibration
from ...control import (AdaptiveController, ControlMemory, ControlRecord, ControlSettings,
                       Controller, Decision, FixedController, GoodputGuard, Outcome, StepView,
                       truncate)
from ...proposers.base import EMPTY_DRAFT, Draft
from ...api.params import SamplingParams
from ...api.stats import geometric_mean
from ...errors import InvalidInputError
from ...proposers import free_proposer
from ...control.limit import draft_limit
from .accept import matched
from .replay import PLAIN_LABEL, Traces
from .replay import load_traces as load_run

ProposeFn = Callable[[Sequence[int], int], Draft]
"""(token history, k) -> a draft of at most k tokens continuing the history."""


@dataclass(frozen=True)
class Trace:
    name: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # the target's own (greedy) continuation
    category: str = ""
    # proposer name -> per output position, a recorded draft {"tokens": [...], "confidence": [...]}
    drafts: Mapping[str, Sequence[Mapping]] = field(default_factory=dict)


def load_traces(path: str | Path) -> list[Trace]:
    """Generation traces, checked: a JSONL of ``{name, category, prompt, output[, drafts]}``
    (what :func:`save_traces` writes), or a run recorded with ``edgespec bench --record``
    (its folder or its ``traces.jsonl``, read by :func:`edgespec.lab.replay.replay.load_traces`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "traces.jsonl"
    if not path.exists():
        raise InvalidInputError(f"{path} not found: give a JSONL of {{name, prompt, output}} "
                                "token traces or a run folder made with `edgespec bench --record`")
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"{path} is not a readable trace file ({e})") from None
    out = []
    for i, line in lines:
        try:
            d = json.loads(line)
        except ValueError as e:
            raise InvalidInputError(f"{path}:{i} is not JSON ({e})") from None
        if i == lines[0][0] and isinstance(d, dict) and d.get("kind") == "edgespec-bench-traces":
            return run_traces(load_run(path))
        try:
            out.append(Trace(name=str(d["name"]), prompt=tuple(int(t) for t in d["prompt"]),
                             output=tuple(int(t) for t in d["output"]),
                             category=str(d.get("category", "")), drafts=d.get("drafts") or {}))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInputError(f"{path}:{i} is not a trace: it needs name, prompt and "
                                    f"output (token ids), got {type(e).__name__}: {e}") from None
    return out


def run_traces(run: Traces) -> list[Trace]:
    """A recorded run's generations: each prompt's recorded prompt and output tokens, once
    (greedy outputs agree across configurations; the plain path's is taken first)."""
    chosen: dict[str, Mapping] = {}  # in the order the run first met each prompt
    for r in run.measured:
        name = str(r.get("prompt_id") or f"unit {r.get('unit')}")
        if name not in chosen or (r.get("config") == PLAIN_LABEL
                                  and chosen[name].get("config") != PLAIN_LABEL):
            chosen[name] = r
    return [Trace(name=name, prompt=tuple(int(t) for t in r["prompt"]),
                  output=tuple(int(t) for t in r["output"]), category=str(r.get("category") or ""))
            for name, r in chosen.items()]


def save_traces(traces: Iterable[Trace], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in traces:
            rec = {"name": t.name, "category": t.category, "prompt": list(t.prompt),
                   "output": list(t.output)}
            if t.drafts:
                rec["drafts"] = {k: list(v) for k, v in t.drafts.items()}
            f.write(json.dumps(rec) + "\n")


# --- proposers ---------------------------------------------------------------------
def from_proposer(proposer, trace: Trace, sampling=None) -> ProposeFn:
    """Wraps a real (free) proposer: one session over the trace's prompt, fed what was emitted.

    Replay calls it with a history that only grows, so the session's ``accept``
    sees exactly the tokens the engine would have appended.
    """
    session = proposer.open(list(trace.prompt), sampling or SamplingParams())
    seen = [len(trace.prompt)]

    def propose(history: Sequence[int], k: int) -> Draft:
        if len(history) > seen[0]:
            session.accept(list(history[seen[0]:]), 0)
            seen[0] = len(history)
        return session.propose(k)
    return propose


def recorded(trace: Trace, name: str) -> ProposeFn:
    """Replays the drafts stored in ``trace.drafts[name]`` (one per output position)."""
    per_pos = trace.drafts[name]
    base = len(trace.prompt)

    def propose(history: Sequence[int], k: int) -> Draft:
        i = len(history) - base
        if not 0 <= i < len(per_pos) or not per_pos[i]:
            return EMPTY_DRAFT
        rec = per_pos[i]
        toks = tuple(rec["tokens"][:k])
        conf = rec.get("confidence")
        return Draft(tokens=toks, confidence=tuple(conf[:len(toks)]) if conf else None,
                     source=name, match_length=int(rec.get("match_length", 0)))
    return propose


# --- replay ------------------------------------------------------------------------
@dataclass
class ReplayResult:
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    by_proposer: dict[str, int] = field(default_factory=dict)  # verify passes per proposer
    events: list[ControlRecord] = field(default_factory=list)
    decisions: list[tuple[int, Decision]] = field(default_factory=list)  # (position, decision)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def replay(trace: Trace, controller: Controller, cal: Calibration,
           proposers: Mapping[str, ProposeFn], *, costly: Mapping[str, float] | None = None,
           candidate_length: int = 15, charge: Calibration | None = None,
           report_tokens: bool = True) -> ReplayResult:
    """Run ``controller`` over one recorded generation, through the engine's protocol.

    Each step: a :class:`StepView` with a candidate from every free proposer (proposed
    at ``candidate_length``), ``decide``, the chosen candidate cut to ``k`` (a costly
    proposer, listed in ``costly`` with its seconds per drafted token, is asked for
    exactly ``k`` after the decision), greedy verification against the recorded output,
    then ``observe`` with the tokens the step appended. Steps are charged by ``cal``, or
    by ``charge`` when the device really behaves otherwise than the controller was told
    (a stale calibration). ``report_tokens=False`` leaves ``Outcome.tokens`` empty, so
    the controller learns from verified drafts alone (no shadow scoring).
    """
    costly = dict(costly or {})
    charge = charge or cal
    out = trace.output
    history = list(trace.prompt)
    res = ReplayResult()
    pos = 0
    while pos < len(out):
        remaining = len(out) - pos
        limit = draft_limit(candidate_length, remaining, remaining)  # the loop's own rule
        view = StepView(generated=pos, remaining=remaining,
                        candidates={name: truncate(fn(history, candidate_length), limit)
                                    for name, fn in proposers.items() if name not in costly})
        d = controller.decide(view)
        res.decisions.append((pos, d))
        draft, draft_s = view.draft_for(d), 0.0
        if draft is None and not d.plain:
            if d.proposer not in costly:
                raise ValueError(f"the controller chose {d.proposer!r}, which is neither a "
                                 "candidate nor a costly proposer of this replay")
            k = min(d.k, limit)
            draft = truncate(proposers[d.proposer](history, k), k)
            draft_s = costly[d.proposer] * len(draft)
        drafted = draft.tokens if draft is not None else ()
        a = matched(drafted, out, pos)
        emitted = tuple(out[pos:pos + min(a + 1, remaining)])
        verify_s = charge.seconds(len(drafted) + 1)
        res.steps += 1
        res.seconds += draft_s + verify_s
        if drafted:
            res.drafted += len(drafted)
            res.accepted += a
            res.by_proposer[d.proposer] = res.by_proposer.get(d.proposer, 0) + 1
        else:
            res.plain_steps += 1
        controller.observe(Outcome(
            proposer=d.proposer if drafted else None, drafted=len(drafted), accepted=a,
            draft_seconds=draft_s, verify_seconds=verify_s,
            tokens=emitted if report_tokens else (),
            confidence=draft.confidence if drafted else None,
            match_length=draft.match_length if drafted else 0))
        res.events.extend(controller.drain_events())
        history.extend(emitted)
        pos += len(emitted)
        res.tokens += len(emitted)
    return res


def standard_configs(cal: Calibration, proposers: Mapping[str, bool] | Sequence[str],
                     ks: Sequence[int] = (1, 2, 3, 4, 6, 8),
                     settings: ControlSettings | None = None,
                     token_seconds: Mapping[str, float] | None = None,
                     guard: bool = True, memory: bool = False) -> dict[str, Callable[[], Controller]]:
    """Controller factories: fixed k for the first proposer, and adaptive over all of them.

    The adaptive one shares one :class:`GoodputGuard` (and, with ``memory``, one
    :class:`ControlMemory`) across traces, as an engine would, so trace order matters.
    """
    if not isinstance(proposers, Mapping):
        proposers = {p: False for p in proposers}
    first = next(iter(proposers))
    s = settings or ControlSettings()
    g = GoodputGuard(s, plain_seconds_prior=cal.step_seconds) if guard else None
    mem = ControlMemory() if memory else None
    configs: dict[str, Callable[[], Controller]] = {
        f"fixed k={k}": (lambda k=k: FixedController(first, k)) for k in ks}
    configs["adaptive"] = lambda: AdaptiveController(proposers, cal, s, g, token_seconds=token_seconds,
                                                     memory=mem)
    return configs


def compare(traces: Sequence[Trace], cal: Calibration,
            proposers: Mapping[str, ProposeFn] | Callable[[Trace], Mapping[str, ProposeFn]],
            configs: Mapping[str, Callable[[], Controller]],
            costly: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Speedup over plain decoding, {config: {trace name: ratio}} (plain = len(output) 1-token passes).

    ``proposers`` may be a function of the trace (stateful proposers need a fresh
    session per replay, see :func:`from_proposer`).
    """
    table: dict[str, dict[str, float]] = {c: {} for c in configs}
    for t in traces:
        plain = len(t.output) * cal.seconds(1)
        for cname, make in configs.items():
            props = proposers(t) if callable(proposers) else proposers
            r = replay(t, make(), cal, props, costly=costly)
            table[cname][t.name] = plain / r.seconds if r.seconds else 1.0
    return table


def best_cut(cal: Calibration, accepted: int) -> int:
    """Of a draft whose first ``accepted`` tokens the target takes, the prefix (0 = a plain
    step) with the most tokens per second on the curve; the shortest on a tie."""
    return max(range(accepted + 1), key=lambda d: (d + 1) / cal.seconds(d + 1))


def foresight(trace: Trace, cal: Calibration, proposers: Mapping[str, ProposeFn],
              max_draft: int = 15) -> float:
    """Speedup of a controller that knows the future: each step it verifies exactly the
    prefix of a candidate the target will accept, cut to the length with the best tokens
    per second on the curve, or takes a plain step. No controller over these proposers
    can beat it, so it says what a device's cost curve allows them at most."""
    hist, out, i, seconds = list(trace.prompt), trace.output, 0, 0.0
    while i < len(out):
        longest = 0
        for propose in proposers.values():
            draft = propose(hist, max_draft).tokens
            longest = max(longest, matched(draft, out, i))
        best_d = best_cut(cal, longest)
        seconds += cal.seconds(best_d + 1)
        hist += list(out[i:i + best_d + 1])
        i += best_d + 1
    return len(out) * cal.seconds(1) / seconds if seconds else 1.0


def copy_bound(trace: Trace, cal: Calibration, min_tail: int = 1, max_draft: int = 15) -> float:
    """Speedup of the best any context-copy proposer could do, knowing the future.

    Each step it drafts the longest stretch of the output still to come that followed
    some earlier occurrence (prompt or output so far) of the context's last ``min_tail``
    tokens, cut to the length with the best tokens per second on the curve. Prompt
    lookup, n-gram statistics and suffix trees all draft what followed a matched tail
    and only differ in which occurrence they pick, so none of them can pass this with
    tails of ``min_tail`` tokens or more: it tells whether a target speedup is within
    reach of copying at all on a device's cost curve, or needs another kind of proposer.
    """
    if min_tail < 1:
        raise ValueError("min_tail must be at least 1")
    seq = [*trace.prompt, *trace.output]
    start, out_len = len(trace.prompt), len(trace.output)
    # tail -> positions that follow an occurrence of it, for the part of seq seen so far
    follows: dict[tuple[int, ...], list[int]] = {}
    indexed = min_tail  # positions j < indexed are in ``follows``

    def longest(cur: int) -> int:
        nonlocal indexed
        while indexed < cur:
            follows.setdefault(tuple(seq[indexed - min_tail:indexed]), []).append(indexed)
            indexed += 1
        best = 0
        for j in follows.get(tuple(seq[cur - min_tail:cur]), ()):
            n = 0
            while (n < max_draft and cur + n < len(seq) and j + n < cur
                   and seq[j + n] == seq[cur + n]):
                n += 1
            best = max(best, n)
        return best

    i, seconds = 0, 0.0
    while i < out_len:
        # the pass's own token is the last one: drafts never run past the output
        a = min(longest(start + i) if start + i >= min_tail else 0, out_len - i - 1)
        d = best_cut(cal, a)
        seconds += cal.seconds(d + 1)
        i += d + 1
    return out_len * cal.seconds(1) / seconds if seconds else 1.0


def _by_category(traces: Sequence[Trace]) -> dict[str, list[str]]:
    """Category (or, without one, the trace's own name) -> its traces' names, in order."""
    cats: dict[str, list[str]] = {}
    for t in traces:
        cats.setdefault(t.category or t.name, []).append(t.name)
    return cats


def format_table(table: Mapping[str, Mapping[str, float]], traces: Sequence[Trace]) -> str:
    """Rows = configs; columns = categories (geometric mean of their traces), then min and mean."""
    cats = _by_category(traces)
    head = ["config"] + list(cats) + ["min", "geomean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cname, row in table.items():
        per_cat = [geometric_mean(row[n] for n in names) for names in cats.values()]
        cells = [f"{x:.2f}" for x in per_cat] + [f"{min(row.values()):.2f}", f"{geometric_mean(row.values()):.2f}"]
        lines.append("| " + " | ".join([cname] + cells) + " |")
    return "\n".join(lines)


def format_summary(table: Mapping[str, Mapping[str, float]], traces: Sequence[Trace],
                   apart: Sequence[str] = ("humanevalfix",),
                   also: Sequence[str] = ("summarization",)) -> str:
    """Rows = configs; the figures a bench report leads with: geometric mean over traces,
    the mean of the category medians (categories in ``apart``, a separate prompt set,
    left out of it and shown on their own), the worst category median, and the medians
    of the categories in ``also``."""
    cats = _by_category(traces)
    shown = [c for c in (*also, *apart) if c in cats]
    head = ["config", "geomean", "mean of category medians", "worst category"] + shown
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cname, row in table.items():
        med = {c: statistics.median(row[n] for n in names) for c, names in cats.items()}
        main_cats = [c for c in med if c not in apart] or list(med)
        worst = min(med, key=med.get)
        cells = [f"{geometric_mean(row.values()):.2f}",
                 f"{sum(med[c] for c in main_cats) / len(main_cats):.2f}",
                 f"{med[worst]:.2f} ({worst})"] + [f"{med[c]:.2f}" for c in shown]
        lines.append("| " + " | ".join([cname] + cells) + " |")
    return "\n".join(lines)


def native_proposers(names: Sequence[str], options: Mapping[str, dict] | None = None):
    """A per-trace proposer factory for :func:`compare`: the shipped free proposers
    (``ngram``, ``suffix``), each with a fresh session per trace."""
    def make(trace: Trace) -> dict[str, ProposeFn]:
        return {name: from_proposer(free_proposer(name, **(options or {}).get(name, {})), trace)
                for name in names}
    return make


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.lab.replay.generations",
                                 description="Replay fixed and adaptive control on recorded traces.")
    ap.add_argument("traces", help="JSONL of {name, category, prompt, output} token traces, or "
                    "a run folder recorded with `edgespec bench --record`")
    ap.add_argument("--calibration", help="a calibration JSON (default: the 2-core CPU prior)")
    ap.add_argument("--linear", type=float, help="use cost(n) = 1 + X (n - 1) instead")
    ap.add_argument("--proposers", default="suffix",
                    help="comma-separated free proposers: ngram, suffix")
    args = ap.parse_args(argv)
    traces = load_traces(args.traces)
    if args.linear is not None:
        cal = Calibration.linear(args.linear)
    elif args.calibration:
        cal = Calibration.from_json(json.loads(Path(args.calibration).read_text()))
    else:
        cal = Calibration.prior_cpu()
    names = [n for n in args.proposers.split(",") if n]
    # the controller cuts drafts itself, so let suffix drafts run past the match length
    opts = {"ngram": {"max_draft": 15}, "suffix": {"max_draft": 15, "use_global": False, "factor": 3.0}}
    table = compare(traces, cal, native_proposers(names, opts), standard_configs(cal, names))
    make = native_proposers(names, opts)
    table["foresight (bound)"] = {t.name: foresight(t, cal, make(t)) for t in traces}
    for tail in (1, 2):
        table[f"any copy, tail >= {tail} (bound)"] = {t.name: copy_bound(t, cal, tail)
                                                      for t in traces}
    print(format_table(table, traces))
    print()
    print(format_summary(table, traces))
    return 0


if __name__ == "__main__":
    sys.exit(main())
