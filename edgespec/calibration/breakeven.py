"""When a draft pays on this machine: the acceptance a proposer needs to beat plain
decoding, from the device's verify-cost curve and the proposer's own cost per draft token.

A pass verifying ``k`` drafted tokens costs ``cost(k + 1)`` plain steps on the target plus
``k * d`` steps of drafting (``d``: one draft token's cost in target steps; 0 for the free
proposers). With each drafted token accepted with probability ``a`` (independently, the
usual model), the pass emits ``1 + a + ... + a^k`` tokens where a plain step emits one, so
it pays when

    (1 - a^(k+1)) / (1 - a)  >  cost(k + 1) + k * d.

:func:`needed_acceptance` solves that for the smallest ``a`` over the draft lengths the
curve covers. Example: a 2-token pass costing 1.89 steps and a draft model at 0.70 steps
per token need ``1 + a > 2.59``: impossible, so that draft never pays here, whatever it
accepts; the same pass with a free proposer needs ``a > 0.89``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class BreakEven:
    """The easiest draft length to pay at: ``acceptance`` (None: no acceptance pays) at
    ``k`` drafted tokens, whose pass costs ``pass_steps`` target steps plus ``draft_steps``
    of drafting."""

    k: int
    acceptance: float | None
    pass_steps: float
    draft_steps: float


def emitted(a: float, k: int) -> float:
    """Expected tokens a pass of ``k`` drafts emits at per-token acceptance ``a``."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def needed_acceptance(cost: Callable[[float], float], draft_steps_per_token: float,
                      ks: Iterable[int] = range(1, 17)) -> BreakEven:
    """The least per-token acceptance at which some draft length in ``ks`` beats plain
    steps, ``cost(n)`` being an n-token pass in plain steps."""
    best: BreakEven | None = None
    for k in ks:
        pass_steps = float(cost(k + 1))
        spend = pass_steps + k * draft_steps_per_token
        if emitted(1.0, k) <= spend:
            cand = BreakEven(k, None, pass_steps, k * draft_steps_per_token)
        else:
            lo, hi = 0.0, 1.0  # emitted() rises with a: bisect for emitted(a) == spend
            for _ in range(50):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if emitted(mid, k) <= spend else (lo, mid)
            cand = BreakEven(k, hi, pass_steps, k * draft_steps_per_token)
        if best is None or _easier(cand, best):
            best = cand
    if best is None:
        raise ValueError("no draft length to consider")
    return best


def _easier(a: BreakEven, b: BreakEven) -> bool:
    if a.acceptance is None:
        return False
    return b.acceptance is None or a.acceptance < b.acceptance


def why_idle(proposer: str, drafted: int, generated: int, accepted: int,
             be: BreakEven, measured: bool = True) -> str | None:
    """One plain-language line on why a proposer the user asked for drafted little or
    nothing, or None where it drafted a fair share (a tenth of the tokens or more)."""
    if proposer in ("", "none") or generated <= 0 or drafted * 10 >= generated:
        return None
    got = (f"; its drafts here were accepted {accepted / drafted:.0%}" if drafted else "")
    where = "on this machine" if measured else "on the CPU prior (this machine is not measured yet)"
    cost = f"a {be.k + 1}-token verify pass costs {be.pass_steps:.2f} plain steps {where}"
    if be.draft_steps > 0:
        cost += f" and drafting {be.k} token{'s' if be.k > 1 else ''} {be.draft_steps:.2f} more"
    if be.acceptance is None:
        return (f"speculation stayed off ({proposer} drafted {drafted} of {generated} tokens): "
                f"{cost}, so no draft pays here even if every drafted token is accepted; a "
                "free proposer (ngram, suffix) or a device whose verify passes cost less "
                "(`edgespec plan` shows the curve) would")
    return (f"speculation stayed mostly off ({proposer} drafted {drafted} of {generated} "
            f"tokens): {cost}, so a draft pays only where at least {be.acceptance:.0%} of "
            f"drafted tokens are accepted{got}; text that repeats its input (edits, "
            "extraction, summaries) gets there")
