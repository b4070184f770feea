"""What a replayed pass costs: the device's pass time by batch size *and* context depth,
plus what the real loop pays around each pass (pure: no model, no clock).

The request loop's decode time is, pass by pass (``Step.elapsed`` differences, which is
exactly how :class:`edgespec.api.stats.RequestStats` defines decode seconds):

    gap_i = draft_i + pass_i + loop_i

* ``pass_i``: the target's ``llama_decode`` over ``n`` rows at ``depth`` cached cells,
  logits copied out (``Step.verify_seconds``). :class:`DepthCurve` prices it from a
  calibration taken at a few depths, linear in batch size between measured sizes
  (the curve need not be monotone: kernel switches) and linear in depth between measured
  depths (attention reads every cached cell, so its cost grows linearly with depth).
* ``draft_i``: the free proposers' candidates (every pass where any may draft) and a
  costly proposer's tokens (``Step.draft_seconds``).
* ``loop_i``: everything else of the pass: the controller, sampling/verification of each
  row, emission, the consumer's own handling of the event. :class:`Overheads` carries it
  per configuration as a fixed cost per plain pass, per verify pass and per verified row,
  fitted from the recorded gaps (:func:`fit_overheads`).

Decode seconds of a request = sum of its gaps + the tail after the last pass (flush,
stats sinks). The plain path goes through the same model, so a speedup is a ratio of two
predictions on the same curve.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ...calibration.curve import Calibration


@dataclass(frozen=True)
class DepthCurve:
    """Pass seconds by (rows, depth): one :class:`Calibration` per measured depth.

    Between measured depths the seconds are linear in depth; below the shallowest they
    are the shallowest's; beyond the deepest they continue along the last two depths'
    slope (never below the deepest's), which is attention's linear growth.
    """

    curves: tuple[tuple[int, Calibration], ...]  # (depth in cached cells, curve), ascending
    busy: float = 0.0  # other processes' share of the CPUs while it was measured

    def __post_init__(self) -> None:
        if not self.curves:
            raise ValueError("a depth curve needs at least one measured depth")
        cur = tuple(sorted(((int(d), c) for d, c in self.curves), key=lambda x: x[0]))
        if len({d for d, _ in cur}) != len(cur):
            raise ValueError("a depth curve measures each depth once")
        object.__setattr__(self, "curves", cur)

    @classmethod
    def flat(cls, cal: Calibration, depth: int = 64) -> "DepthCurve":
        """One depth only: the classic calibration, the same at every context length."""
        return cls(((depth, cal),))

    @property
    def depths(self) -> tuple[int, ...]:
        return tuple(d for d, _ in self.curves)

    def seconds(self, n: float, depth: float) -> float:
        """Wall time of an ``n``-row pass over ``depth`` cached cells."""
        cur = self.curves
        if len(cur) == 1 or depth <= cur[0][0]:
            return cur[0][1].seconds(n)
        for (d0, c0), (d1, c1) in zip(cur, cur[1:]):
            if depth <= d1:
                s0, s1 = c0.seconds(n), c1.seconds(n)
                return s0 + (s1 - s0) * (depth - d0) / (d1 - d0)
        (d0, c0), (d1, c1) = cur[-2], cur[-1]
        s0, s1 = c0.seconds(n), c1.seconds(n)
        return max(s1, s1 + (s1 - s0) * (depth - d1) / (d1 - d0))

    def at(self, depth: int) -> Calibration:
        """The curve at one depth (interpolated), as a :class:`Calibration` for a controller."""
        ns = sorted({n for _, c in self.curves for n, _ in c.points})
        step = self.seconds(1, depth)
        return Calibration(step_seconds=step, points=tuple((n, self.seconds(n, depth) / step)
                                                           for n in ns), source="synthetic")

    def to_json(self) -> dict:
        return {"busy": self.busy,
                "depths": [{"depth": d, "calibration": c.to_json()} for d, c in self.curves]}

    @classmethod
    def from_json(cls, d: Mapping) -> "DepthCurve":
        try:
            return cls(tuple((int(x["depth"]), Calibration.from_json(x["calibration"]))
                             for x in d["depths"]), busy=float(d.get("busy", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a recorded depth curve ({e})") from None


@dataclass(frozen=True)
class Overheads:
    """What one configuration's loop pays around its passes, in seconds (see the module
    docstring): ``plain`` per plain pass, ``verify`` + ``per_row`` x drafted per verify pass,
    ``propose`` per pass where free proposers are consulted, ``costly_token`` per token a
    costly proposer drafts, ``tail`` once per request."""

    plain: float = 0.0
    verify: float = 0.0
    per_row: float = 0.0
    propose: float = 0.0
    costly_token: float = 0.0
    tail: float = 0.0
    passes: int = 0  # recorded passes the fit saw

    def loop(self, drafted: int) -> float:
        return self.plain if drafted <= 0 else self.verify + self.per_row * drafted


NONE = Overheads()


@dataclass(frozen=True)
class CostModel:
    """Prices a replayed pass. ``scale`` multiplies the curve per pass kind ("plain",
    "verify"): the run-wide ratio of measured to calibrated pass times, when fitted."""

    curve: DepthCurve
    overheads: Mapping[str, Overheads] = field(default_factory=dict)  # per configuration
    depth: bool = True  # False: price every pass at the curve's shallowest depth
    scale: Mapping[str, float] = field(default_factory=dict)

    def pass_seconds(self, rows: int, depth: int) -> float:
        d = depth if self.depth else self.curve.depths[0]
        kind = "plain" if rows <= 1 else "verify"
        return self.curve.seconds(rows, d) * self.scale.get(kind, 1.0)

    def over(self, config: str) -> Overheads:
        return self.overheads.get(config, NONE)


def _median(xs: Sequence[float], default: float = 0.0) -> float:
    return statistics.median(xs) if xs else default


def fit_overheads(passes: Iterable[Mapping], tails: Iterable[float] = ()) -> Overheads:
    """Overheads from recorded passes, each with ``gap_seconds``, ``verify_seconds``,
    ``draft_seconds``, ``drafted``, ``proposed`` (free proposers were consulted) and
    ``costly`` (a costly proposer drafted): medians, since a shared machine's hiccups
    land on single passes.

    ``loop`` = gap - pass - draft. Plain passes give ``plain``; verify passes are grouped by
    draft length, and the line through the groups' medians (least squares weighted by
    group size) gives ``verify`` and ``per_row``. ``propose`` is the median draft time of
    passes that only consulted free proposers; ``costly_token`` the median of a costly
    draft's time beyond that, per drafted token.
    """
    plain: list[float] = []
    by_len: dict[int, list[float]] = {}
    propose: list[float] = []
    costly: list[tuple[float, int]] = []
    n = 0
    for p in passes:
        n += 1
        loop = float(p["gap_seconds"]) - float(p["verify_seconds"]) - float(p["draft_seconds"])
        k = int(p["drafted"])
        if k > 0:
            by_len.setdefault(k, []).append(loop)
        else:
            plain.append(loop)
        if p.get("costly") and k > 0:
            costly.append((float(p["draft_seconds"]), k))
        elif p.get("proposed"):
            propose.append(float(p["draft_seconds"]))
    a_plain = _median(plain)
    verify, per_row = _line({k: (_median(v), len(v)) for k, v in by_len.items()}, a_plain)
    prop = _median(propose)
    tok = _median([max(s - prop, 0.0) / k for s, k in costly])
    return Overheads(plain=a_plain, verify=verify, per_row=per_row, propose=prop,
                     costly_token=tok, tail=_median(list(tails)), passes=n)


def _line(groups: Mapping[int, tuple[float, int]], fallback: float) -> tuple[float, float]:
    """(intercept, slope) of loop time against draft length through the group medians."""
    if not groups:
        return fallback, 0.0
    if len(groups) == 1:
        (k, (m, _)), = groups.items()
        return m, 0.0
    w = sum(c for _, c in groups.values())
    xbar = sum(k * c for k, (_, c) in groups.items()) / w
    ybar = sum(m * c for _, (m, c) in groups.items()) / w
    sxx = sum(c * (k - xbar) ** 2 for k, (_, c) in groups.items())
    sxy = sum(c * (k - xbar) * (m - ybar) for k, (m, c) in groups.items())
    slope = max(sxy / sxx, 0.0) if sxx > 0 else 0.0  # a row never saves time
    return ybar - slope * xbar, slope


def fit_scale(passes: Iterable[Mapping], curve: DepthCurve) -> dict[str, float]:
    """Run-wide median of measured / curve pass time, for plain and verify passes apart
    (how far the loop's passes sit from the calibration: cache state, the logits layout)."""
    ratios: dict[str, list[float]] = {"plain": [], "verify": []}
    for p in passes:
        rows = int(p["rows"])
        want = curve.seconds(rows, int(p["depth"]))
        if want > 0 and float(p["verify_seconds"]) > 0:
            ratios["plain" if rows <= 1 else "verify"].append(float(p["verify_seconds"]) / want)
    return {k: statistics.median(v) for k, v in ratios.items() if v}
