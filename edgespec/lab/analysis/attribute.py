"""Attribution: which part of a speculative setup explains a goodput change between two
sets of records (before and after a change of model, build, kernels or policy).

Goodput here is decode tokens per decode second over a configuration's requests. Per
target pass it is E / C, tokens emitted per pass over seconds per pass, so

    log(R_after / R_before) = log(proposer quality) + log(scheduling) - log(verification cost)
                              + residual

with, over pass sizes n (a pass holds the pending token and n - 1 drafts) whose shares
are w(n), per-pass seconds c(n) and expected tokens e(n) = 1 + sum_{i < n-1} a_i (a_i:
acceptance at draft position i):

* **proposer quality** = sum w_a e_a / sum w_a e_b: the after side's acceptance against
  the before side's, at the after side's pass sizes;
* **verification cost** = sum w_a c_a / sum w_a c_b: seconds per pass at equal sizes;
* **scheduling** = (sum w_a e_b / sum w_b e_b) / (sum w_a c_b / sum w_b c_b): how passes
  were sized and how often the controller took plain steps (fallbacks, guard), priced
  with the before side's acceptance and costs;
* **residual**: time outside target passes (drafting, the loop).

Two causes sit outside that product. **Numerical drift**: where greedy output left the
plain path's (near-ties, parity), the text and hence the workload changed; its effect is
the change over all requests less the change over the requests whose output kept parity.
**Feature incompatibility**: requests refused (an error record) are not served at all;
its effect is the change in the share of requests served.

Records: ``bench.json`` files written by ``edgespec bench`` (per-request records with pass
sizes, parity and divergence attribution), or JSONL of ``generate --json`` records or of a
stats sink (pass sizes are then approximated by plain steps and the mean verify pass).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ...errors import InvalidInputError

CAUSES = ("proposer_quality", "verification_cost", "scheduling", "numerical_drift",
          "feature_incompatibility")
#: |log effect| below this is noise, not a cause (2%)
NEGLIGIBLE = math.log(1.02)


@dataclass
class Req:
    """One request, normalised from any record shape."""
    config: str
    key: tuple | None = None  # (prompt_id, turn) where the records have one
    error: str | None = None
    decode_tokens: float = 0.0
    decode_seconds: float = 0.0
    passes: dict[int, float] = field(default_factory=dict)  # pass size -> count
    pass_seconds: dict[int, float] = field(default_factory=dict)  # pass size -> seconds
    position_drafted: list[float] = field(default_factory=list)
    position_accepted: list[float] = field(default_factory=list)
    control_events: dict[str, int] = field(default_factory=dict)
    parity: bool | None = None
    divergence: str | None = None


# --- loading ---------------------------------------------------------------------------------
def load(path: str | Path) -> list[Req]:
    """Records from a bench.json, or a JSONL of generate --json / stats-sink records."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidInputError(f"cannot read {p}: {e.strerror}") from None
    try:
        data = json.loads(text)
        items = data["records"] if isinstance(data, dict) and "records" in data else [data]
    except ValueError:
        items = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except ValueError:
                    raise InvalidInputError(f"{p}:{i}: not JSON; attribute reads bench.json files "
                                            "or JSONL of generate --json / stats records") from None
    reqs = [r for r in (normalise(x) for x in items if isinstance(x, dict)) if r is not None]
    if not reqs:
        raise InvalidInputError(f"{p} holds no request records (expected a bench.json from "
                                "`edgespec bench` or JSONL from `edgespec generate --json`)")
    return reqs


def normalise(rec: Mapping) -> Req | None:
    if rec.get("kind") == "identity":
        return None
    stats = rec.get("stats") if isinstance(rec.get("stats"), Mapping) else rec
    config = str(rec.get("config") or stats.get("proposer") or rec.get("proposer") or "?")
    key = (rec["prompt_id"], rec.get("turn", 0)) if "prompt_id" in rec else None
    if rec.get("error"):
        return Req(config, key, error=str(rec["error"]))
    gen = float(stats.get("generated_tokens") or 0)
    r = Req(config, key, decode_tokens=max(gen - 1, 0.0),
            decode_seconds=float(stats.get("decode_seconds") or 0.0),
            control_events={str(k): int(v) for k, v in (stats.get("control_events") or {}).items()},
            parity=rec.get("parity"),
            divergence=(rec.get("divergence") or {}).get("kind") if rec.get("divergence") else None)
    if "pass_size_hist" in rec:
        r.passes = {int(k): float(v) for k, v in rec["pass_size_hist"].items()}
        r.pass_seconds = {int(k): float(v) for k, v in rec.get("pass_seconds", {}).items()}
    else:  # a stats record: plain steps, and verify passes at their mean size
        plain, verify = float(stats.get("plain_steps") or 0), float(stats.get("verify_passes") or 0)
        if plain:
            r.passes[1] = plain
            r.pass_seconds[1] = float(stats.get("plain_seconds") or 0.0)
        if verify:
            n = 1 + max(1, round(float(stats.get("drafted") or 0) / verify))
            r.passes[n] = r.passes.get(n, 0.0) + verify
            r.pass_seconds[n] = r.pass_seconds.get(n, 0.0) + float(stats.get("verify_seconds") or 0)
    if rec.get("position_drafted") is not None:
        r.position_drafted = [float(x) for x in rec["position_drafted"]]
        r.position_accepted = [float(x) for x in rec["position_accepted"]]
    elif stats.get("position_acceptance"):
        verify = float(stats.get("verify_passes") or 0)
        r.position_drafted = [verify] * len(stats["position_acceptance"])
        r.position_accepted = [verify * float(a) for a in stats["position_acceptance"]]
    return r


# --- the pooled view of one side --------------------------------------------------------------
@dataclass
class Side:
    requests: int
    refused: int
    refusals: list[str]
    tokens: float
    seconds: float
    share: dict[int, float]  # pass size -> share of passes
    cost: dict[int, float]  # pass size -> mean seconds per pass
    acceptance: list[float]  # per draft position
    pass_seconds: float  # seconds in target passes
    passes: float
    control_events: dict[str, int]
    diverged: int
    near_ties: int
    with_parity: int

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def served(self) -> float:
        return (self.requests - self.refused) / self.requests if self.requests else 0.0

    def expected(self, n: int, acceptance: Sequence[float] | None = None) -> float:
        a = self.acceptance if acceptance is None else acceptance
        return 1.0 + sum(a[i] if i < len(a) else (a[-1] if a else 0.0) for i in range(n - 1))

    def to_dict(self) -> dict:
        return {"requests": self.requests, "refused": self.refused,
                "decode_tokens_per_second": self.rate,
                "tokens_per_pass": self.tokens_per_pass,
                "seconds_per_pass": self.pass_seconds / self.passes if self.passes else None,
                "pass_size_share": {str(k): v for k, v in sorted(self.share.items())},
                "seconds_per_pass_by_size": {str(k): v for k, v in sorted(self.cost.items())},
                "acceptance_by_position": self.acceptance,
                "plain_step_share": self.share.get(1, 0.0),
                "control_events": self.control_events,
                "diverged": self.diverged, "near_ties": self.near_ties}

    @property
    def tokens_per_pass(self) -> float | None:
        return sum(w * self.expected(n) for n, w in self.share.items()) if self.share else None


def pool(reqs: Iterable[Req]) -> Side:
    reqs = list(reqs)
    ok = [r for r in reqs if r.error is None]
    passes: dict[int, float] = {}
    secs: dict[int, float] = {}
    drafted: list[float] = []
    accepted: list[float] = []
    events: dict[str, int] = {}
    for r in ok:
        for n, c in r.passes.items():
            passes[n] = passes.get(n, 0.0) + c
            secs[n] = secs.get(n, 0.0) + r.pass_seconds.get(n, 0.0)
        for i, (d, a) in enumerate(zip(r.position_drafted, r.position_accepted)):
            if i >= len(drafted):
                drafted.append(0.0)
                accepted.append(0.0)
            drafted[i] += d
            accepted[i] += a
        for k, v in r.control_events.items():
            events[k] = events.get(k, 0) + v
    total = sum(passes.values())
    return Side(
        requests=len(reqs), refused=len(reqs) - len(ok),
        refusals=sorted({r.error for r in reqs if r.error}),
        tokens=sum(r.decode_tokens for r in ok), seconds=sum(r.decode_seconds for r in ok),
        share={n: c / total for n, c in passes.items()} if total else {},
        cost={n: secs[n] / c for n, c in passes.items() if c},
        acceptance=[a / d if d else 0.0 for a, d in zip(accepted, drafted)],
        pass_seconds=sum(secs.values()), passes=total, control_events=events,
        diverged=sum(1 for r in ok if r.parity is False),
        near_ties=sum(1 for r in ok if r.divergence == "near-tie"),
        with_parity=sum(1 for r in ok if r.parity is not None))


# --- attribution ---------------------------------------------------------------------------------
@dataclass
class Attribution:
    config: str
    before: Side
    after: Side
    change: float  # goodput after / before
    effects: dict[str, float]  # cause -> log effect on goodput (+ = faster)
    residual: float
    cause: str  # the largest effect, or "none" when the change is negligible
    explanation: list[str]

    def to_dict(self) -> dict:
        return {"config": self.config, "goodput_change": self.change,
                "effects": {k: math.exp(v) for k, v in self.effects.items()},
                "residual": math.exp(self.residual), "cause": self.cause,
                "explanation": self.explanation,
                "before": self.before.to_dict(), "after": self.after.to_dict()}


def attribute(before: Sequence[Req], after: Sequence[Req], config: str) -> Attribution:
    """Attribute the goodput change of ``config`` between two record sets."""
    rb = [r for r in before if r.config == config]
    ra = [r for r in after if r.config == config]
    if not rb or not ra:
        raise InvalidInputError(f"configuration {config!r} is not in both record sets "
                                f"(before: {_configs(before)}; after: {_configs(after)}); "
                                "pick one with --config")
    b, a = pool(rb), pool(ra)
    effects = dict.fromkeys(CAUSES, 0.0)
    total = math.log(a.rate / b.rate) if a.rate > 0 and b.rate > 0 else 0.0
    residual = total
    lines = _pass_effects(b, a, effects)
    if lines:
        residual = total - effects["proposer_quality"] - effects["verification_cost"] \
            - effects["scheduling"]
    else:
        lines.append("pass sizes of the after side were not measured before: proposer, "
                     "verification and scheduling effects cannot be separated")
    lines += _drift(rb, ra, b, a, total, effects)
    # feature incompatibility: requests refused are not served
    if a.refused or b.refused:
        effects["feature_incompatibility"] = math.log(max(a.served, 1e-9) / max(b.served, 1e-9))
        new = [m for m in a.refusals if m not in b.refusals]
        lines.append(f"feature incompatibility: refused {b.refused}/{b.requests} -> "
                     f"{a.refused}/{a.requests} requests" + (f"; new: {new[0]}" if new else ""))
    lines.append(f"residual (time outside target passes: drafting, the loop): "
                 f"{math.exp(residual):.2f}x")
    cause = _cause(effects, total)
    head = (f"{config}: goodput {b.rate:.1f} -> {a.rate:.1f} tok/s ({math.exp(total):.2f}x)"
            + (f"; explained mostly by {cause.replace('_', ' ')} "
               f"({math.exp(effects[cause]):.2f}x)" if cause != "none" else
               "; no cause above 2%"))
    return Attribution(config, b, a, math.exp(total), effects, residual, cause, [head, *lines])


def _pass_effects(b: Side, a: Side, effects: dict[str, float]) -> list[str]:
    """Proposer quality, verification cost and scheduling, set in ``effects``, and their
    lines; none (an empty list) when the after side's pass sizes were not measured before."""
    sizes = set(a.share) & set(b.cost)
    if not (a.share and b.share and sizes == set(a.share)):
        return []
    ea = sum(w * a.expected(n) for n, w in a.share.items())
    ea_b = sum(w * b.expected(n) for n, w in a.share.items())
    eb = sum(w * b.expected(n) for n, w in b.share.items())
    ca = sum(w * a.cost[n] for n, w in a.share.items())
    ca_b = sum(w * b.cost[n] for n, w in a.share.items())
    cb = sum(w * b.cost[n] for n, w in b.share.items())
    effects["proposer_quality"] = math.log(ea / ea_b)
    effects["verification_cost"] = -math.log(ca / ca_b)
    effects["scheduling"] = math.log(ea_b / eb) - math.log(ca_b / cb)
    return [
        f"proposer quality: {ea_b:.2f} -> {ea:.2f} tokens per pass at the same pass sizes "
        f"(acceptance by position {_pcts(b.acceptance)} -> {_pcts(a.acceptance)})",
        f"verification cost: {ca_b * 1000:.1f} -> {ca * 1000:.1f} ms per pass at the same "
        f"pass sizes ({_costs(b.cost, a.cost, a.share)})",
        f"scheduling: plain steps {b.share.get(1, 0):.0%} -> {a.share.get(1, 0):.0%} of "
        f"passes, mean pass {_mean(b.share):.2f} -> {_mean(a.share):.2f} tokens; control "
        f"events {_events(b.control_events)} -> {_events(a.control_events)}",
    ]


def _drift(rb: Sequence[Req], ra: Sequence[Req], b: Side, a: Side, total: float,
           effects: dict[str, float]) -> list[str]:
    """Numerical drift, set in ``effects``: the change over all requests less that over
    requests that kept parity; its line, or none."""
    keep_b = {r.key for r in rb if r.parity is not False and r.error is None}
    keep_a = {r.key for r in ra if r.parity is not False and r.error is None}
    both = keep_a & keep_b - {None}
    if not ((a.diverged or b.diverged) and both):
        return []
    pb = pool(r for r in rb if r.key in both)
    pa = pool(r for r in ra if r.key in both)
    if pa.rate > 0 and pb.rate > 0:
        effects["numerical_drift"] = total - math.log(pa.rate / pb.rate)
    return [f"numerical drift: outputs that left the plain path {b.diverged}/"
            f"{b.with_parity} -> {a.diverged}/{a.with_parity} (near-ties {b.near_ties} -> "
            f"{a.near_ties}); goodput over the {len(both)} requests that kept parity "
            f"changed {math.exp(total - effects['numerical_drift']):.2f}x"]


def _cause(effects: dict[str, float], total: float) -> str:
    """The largest effect, or "none" when every one is negligible."""
    drift = effects["numerical_drift"]
    if abs(drift) >= max(NEGLIGIBLE, 0.5 * abs(total)):
        # most of the change lives in requests whose text changed: the acceptance and pass
        # effects measured over them are its consequences, not separate causes
        return "numerical_drift"
    cause = max(CAUSES, key=lambda c: abs(effects[c]))
    if abs(effects[cause]) < NEGLIGIBLE:
        cause = "none"
    return cause


def compared_configs(before: Sequence[Req], after: Sequence[Req]) -> list[str]:
    """Configurations in both sets, the plain path last (its change is the machine's)."""
    common = sorted({r.config for r in before} & {r.config for r in after})
    return [c for c in common if c != "none"] + [c for c in common if c == "none"]


def _configs(reqs: Sequence[Req]) -> str:
    return ", ".join(sorted({r.config for r in reqs})) or "none"


def _pcts(xs: Sequence[float]) -> str:
    return " ".join(f"{x:.0%}" for x in xs[:6]) or "-"


def _mean(share: Mapping[int, float]) -> float:
    return sum(n * w for n, w in share.items())


def _events(ev: Mapping[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(ev.items())) or "none"


def _costs(b: Mapping[int, float], a: Mapping[int, float], share: Mapping[int, float]) -> str:
    top = sorted(share, key=lambda n: -share[n])[:3]
    return "; ".join(f"size {n}: {b.get(n, math.nan) * 1000:.1f} -> {a.get(n, math.nan) * 1000:.1f} ms"
                     for n in sorted(top))


__all__ = ["Attribution", "CAUSES", "Req", "Side", "attribute", "compared_configs", "load",
           "normalise", "pool"]
