"""Per-request speculation metrics: one stats object, pluggable sinks.

Vocabulary (per verify pass): *drafted* tokens were sent to the target;
*accepted* of them matched; the pass then emits accepted + 1 tokens (the +1 is
the target's own token: bonus after a full accept, correction otherwise).
"Accepted length" of a pass counts that +1, so a plain step has length 1.
"""
from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Protocol

if TYPE_CHECKING:
    from .labels import ControlKind, MaybeStopReason


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    prompt_reused: int = 0  # prompt tokens whose KV came from an earlier request (prefix reuse)
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    verify_passes: int = 0  # passes that verified at least one drafted token
    plain_steps: int = 0  # steps with nothing drafted
    accepted_length_hist: Counter[int] = field(default_factory=Counter)  # accepted+1 -> passes
    position_drafted: list[int] = field(default_factory=list)  # per draft position i
    position_accepted: list[int] = field(default_factory=list)
    proposer_tokens: Counter[str] = field(default_factory=Counter)  # proposer -> emitted draft tokens
    proposer_passes: Counter[str] = field(default_factory=Counter)
    control_events: Counter[str] = field(default_factory=Counter)  # kind -> count
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    plain_seconds: float = 0.0
    total_seconds: float = 0.0
    ttft_seconds: float | None = None  # request start to the first emitted token (prefill included)
    token_times: list[float] = field(default_factory=list)  # emission time of each token since start
    stop_reason: MaybeStopReason = ""
    proposer: str = "none"
    identity: str | None = None  # hash of the engine's release identity (edgespec.identity)
    # draft trees (edgespec.decoding.tree): passes that verified a tree, the nodes they held, their
    # branches (leaves), the tokens their accepted paths kept, and how many of those paths
    # left the first branch (the linear draft would not have kept them)
    tree_passes: int = 0
    tree_nodes: int = 0
    tree_branches: int = 0
    tree_accepted: int = 0
    tree_off_first: int = 0
    # the vocabulary bridge's own work (tokenize, detokenize, alignment), part of
    # draft_seconds, kept apart from the draft model's inference (docs/bridge.md)
    bridge_seconds: float = 0.0
    bridge_steps: int = 0

    # --- observation -------------------------------------------------------
    def observe_prefill(self, n_tokens: int, seconds: float, reused: int = 0) -> None:
        self.prompt_tokens = n_tokens
        self.prompt_reused = reused
        self.prefill_seconds += seconds

    def observe_step(self, *, proposer: str | None, drafted: int, accepted: int,
                     emitted: int, draft_seconds: float, verify_seconds: float,
                     elapsed: float) -> None:
        """Record one step. ``emitted`` may be < accepted+1 when a stop cut the step."""
        self.draft_seconds += draft_seconds
        if drafted > 0:
            self.verify_passes += 1
            self.verify_seconds += verify_seconds
            self.drafted += drafted
            self.accepted += accepted
            self.accepted_length_hist[accepted + 1] += 1
            while len(self.position_drafted) < drafted:
                self.position_drafted.append(0)
                self.position_accepted.append(0)
            for i in range(drafted):
                self.position_drafted[i] += 1
                if i < accepted:
                    self.position_accepted[i] += 1
            if proposer:
                self.proposer_passes[proposer] += 1
                self.proposer_tokens[proposer] += accepted
        else:
            self.plain_steps += 1
            self.plain_seconds += verify_seconds
            self.accepted_length_hist[1] += 1
        if emitted > 0 and self.ttft_seconds is None:
            self.ttft_seconds = elapsed
        self.generated_tokens += emitted
        self.token_times.extend([elapsed] * emitted)

    def observe_control(self, kind: ControlKind) -> None:
        self.control_events[kind] += 1

    def finish(self, stop_reason: MaybeStopReason, total_seconds: float) -> None:
        self.stop_reason = stop_reason
        self.total_seconds = total_seconds

    # --- derived -----------------------------------------------------------
    @property
    def prompt_computed(self) -> int:
        """Prompt tokens this request evaluated (the rest were reused)."""
        return self.prompt_tokens - self.prompt_reused

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass (verify or plain), counting the target's own token."""
        n = sum(self.accepted_length_hist.values())
        return sum(k * v for k, v in self.accepted_length_hist.items()) / n if n else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

    @property
    def decode_tokens(self) -> int:
        """Tokens after the first: the first comes out of the prefill pass and counts in TTFT."""
        return max(self.generated_tokens - 1, 0)

    @property
    def decode_seconds(self) -> float:
        """Seconds from the first token to the end of the request.

        Everything before the first token (the target's prefill, a draft model's or
        a proposer's setup over the prompt) is TTFT, reported apart, so a decode rate
        compares decoding with decoding whatever the prompt cost. The plain path's
        rate is defined the same way, so the two divide into a speedup.
        """
        if self.ttft_seconds is None:
            return 0.0
        return max(self.total_seconds - self.ttft_seconds, 0.0)

    @property
    def decode_tokens_per_second(self) -> float:
        """decode_tokens / decode_seconds: the one decode rate the CLI, bench and TUI show."""
        n, t = self.decode_tokens, self.decode_seconds
        return n / t if n > 0 and t > 0 else 0.0

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def other_seconds(self) -> float:
        return max(self.total_seconds - self.prefill_seconds - self.draft_seconds
                   - self.verify_seconds - self.plain_seconds, 0.0)

    @property
    def proposer_share(self) -> dict[str, float]:
        """Fraction of emitted tokens each proposer contributed (rest: the target itself)."""
        n = self.generated_tokens
        if not n:
            return {}
        share = {p: c / n for p, c in self.proposer_tokens.items()}
        share["target"] = max(1.0 - sum(share.values()), 0.0)
        return share

    def to_dict(self) -> dict[str, Any]:
        itl = sorted(self.inter_token_latencies)
        return {
            "proposer": self.proposer,
            "prompt_tokens": self.prompt_tokens,
            "prompt_reused": self.prompt_reused,
            "prompt_computed": self.prompt_computed,
            "generated_tokens": self.generated_tokens,
            "stop_reason": self.stop_reason,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "verify_passes": self.verify_passes,
            "plain_steps": self.plain_steps,
            "mean_accepted_length": self.mean_accepted_length,
            "accepted_length_hist": {str(k): v for k, v in sorted(self.accepted_length_hist.items())},
            "position_acceptance": self.position_acceptance,
            "proposer_share": self.proposer_share,
            "control_events": dict(self.control_events),
            "prefill_seconds": self.prefill_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "plain_seconds": self.plain_seconds,
            "other_seconds": self.other_seconds,
            "total_seconds": self.total_seconds,
            "ttft_seconds": self.ttft_seconds,
            "decode_seconds": self.decode_seconds,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "itl_p50": _pct(itl, 50),
            "itl_p95": _pct(itl, 95),
            "itl_p99": _pct(itl, 99),
            "identity": self.identity,
            **self.tree_dict(),
            **({"bridge_seconds": self.bridge_seconds,
                "bridge_us_per_step": self.bridge_seconds / self.bridge_steps * 1e6}
               if self.bridge_steps else {}),
        }

    def summary(self) -> str:
        d = self.to_dict()
        hist = " ".join(f"{k}:{v}" for k, v in d["accepted_length_hist"].items())
        ttft = f"{d['ttft_seconds'] * 1000:.0f} ms" if d["ttft_seconds"] is not None else "-"
        head = [f"proposer {self.proposer}: {self.generated_tokens} tokens in "
                f"{self.total_seconds:.2f} s ({self.decode_tokens_per_second:.1f} tok/s decode), "
                f"stop: {self.stop_reason}"]
        if self.drafted:  # the plain path (or a request that never drafted) has none of these
            head += [
                f"acceptance {self.accepted}/{self.drafted} = {self.acceptance_rate:.1%}, "
                f"mean accepted length {self.mean_accepted_length:.2f} per target pass "
                f"({self.verify_passes} verify, {self.plain_steps} plain)",
                f"accepted-length histogram {hist}",
                "acceptance by position " + " ".join(f"{a:.0%}"
                                                     for a in self.position_acceptance[:16])]
        elif self.proposer not in ("", "none"):
            head.append(f"nothing drafted: {self.plain_steps} plain steps")
        lines = head + [
            f"time: prefill {self.prefill_seconds * 1000:.0f} ms ({self.prompt_computed} tok"
            f"{f', {self.prompt_reused} reused' if self.prompt_reused else ''}), "
            f"draft {self.draft_seconds * 1000:.0f} ms, verify {self.verify_seconds * 1000:.0f} ms, "
            f"plain {self.plain_seconds * 1000:.0f} ms, other {self.other_seconds * 1000:.0f} ms; "
            f"TTFT {ttft}, ITL p50 {d['itl_p50'] * 1000:.0f} ms p95 {d['itl_p95'] * 1000:.0f} ms",
        ]
        if self.control_events:
            lines.append("control " + ", ".join(f"{k}×{v}" for k, v in self.control_events.items()))
        if self.bridge_steps:
            lines.append(f"bridge: {self.bridge_seconds * 1000:.1f} ms over {self.bridge_steps} "
                         f"proposals ({self.bridge_seconds / self.bridge_steps * 1e6:.0f} µs each), "
                         "apart from the draft model's inference")
        if self.tree_passes:
            lines.append(f"trees: {self.tree_passes} passes, {self.tree_nodes / self.tree_passes:.1f} "
                         f"nodes and {self.tree_branches / self.tree_passes:.1f} branches each, "
                         f"accepted path {self.tree_path_length:.2f}, off the first branch "
                         f"{self.branch_utilisation:.0%}; verify occupancy "
                         f"{self.accepted}/{self.drafted} drafted positions kept")
        return "\n".join(lines)

    # --- draft trees ---------------------------------------------------------------------
    def observe_tree(self, nodes: int, branches: int, accepted: int, off_first: bool) -> None:
        """One tree pass (its drafted nodes also count in observe_step's ``drafted``)."""
        self.tree_passes += 1
        self.tree_nodes += nodes
        self.tree_branches += branches
        self.tree_accepted += accepted
        self.tree_off_first += bool(off_first)

    @property
    def branch_utilisation(self) -> float:
        """Share of tree passes whose accepted path left the first branch: how often the
        extra branches kept tokens the linear draft would have lost."""
        return self.tree_off_first / self.tree_passes if self.tree_passes else 0.0

    @property
    def tree_path_length(self) -> float:
        """Drafted tokens kept per tree pass (the accepted path's length)."""
        return self.tree_accepted / self.tree_passes if self.tree_passes else 0.0

    @property
    def verify_occupancy(self) -> tuple[float, float]:
        """(drafted positions, accepted positions) per verify pass, trees and chains alike."""
        n = self.verify_passes
        return (self.drafted / n, self.accepted / n) if n else (0.0, 0.0)

    def tree_dict(self) -> dict[str, Any]:
        drafted, kept = self.verify_occupancy
        return {"tree_passes": self.tree_passes, "tree_nodes": self.tree_nodes,
                "tree_branches": self.tree_branches, "tree_accepted": self.tree_accepted,
                "tree_path_length": self.tree_path_length,
                "branch_utilisation": self.branch_utilisation,
                "verify_drafted_per_pass": drafted, "verify_accepted_per_pass": kept}


def geometric_mean(values: Iterable[float]) -> float:
    """exp(mean(log x)): the one average of speedups and rates (bench, replay, analysis).

    NaN for no values, so an empty table cell reads as missing rather than as a
    slowdown. A value that is not positive and finite raises ValueError: a zero or NaN
    rate is a measurement that failed, and dropping it silently would make the mean
    look better than the run was. Callers leave such units out first and say so.
    """
    logs = []
    for x in values:
        v = float(x)
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"geometric mean needs positive finite values, got {v!r}")
        logs.append(math.log(v))
    return math.exp(math.fsum(logs) / len(logs)) if logs else math.nan


def _pct(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values (0.0 for none)."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# --- sinks -------------------------------------------------------------------
class StatsSink(Protocol):
    def emit(self, stats: RequestStats) -> None: ...


class ReleaseIdentity(Protocol):
    """What a sink records of an engine's release identity (edgespec.identity.Identity)."""

    @property
    def hash(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


class JsonlSink:
    """Appends one JSON record per request to a file; each carries the hash of the engine's
    release identity, whose full record is written once, before the first request it
    measured (``{"kind": "identity", ...}``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._announced: set[str] = set()

    def announce(self, identity: ReleaseIdentity) -> None:
        if identity.hash in self._announced:
            return
        self._announced.add(identity.hash)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": "identity", "time": time.time(), **identity.to_dict()})
                    + "\n")

    def emit(self, stats: RequestStats) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"time": time.time(), **stats.to_dict()}) + "\n")


class MemorySink:
    """Keeps every record; tests and the TUI's history read it."""

    def __init__(self) -> None:
        self.records: list[RequestStats] = []
        self.identities: dict[str, ReleaseIdentity] = {}  # hash -> edgespec.identity.identity.Identity

    def announce(self, identity: ReleaseIdentity) -> None:
        self.identities.setdefault(identity.hash, identity)

    def emit(self, stats: RequestStats) -> None:
        self.records.append(stats)

