"""Report arithmetic: percentiles, paired per-prompt ratios, geometric means, bootstrap intervals.

A speedup is never a ratio of averages: each prompt is run under the plain path
and under a configuration in the same run, the per-prompt ratio is taken, and
the ratios are summarised by their geometric mean (the right mean for ratios:
a 2x and a 0.5x cancel). The confidence interval resamples *prompts* (all turns
of a conversation move together, since they share a history) with a seeded
generator, so a report is reproducible from its JSON.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from ...api.stats import geometric_mean  # the one geometric mean; bootstrap_ci vectorises it


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); NaN for no values."""
    if not len(values):
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class PairedRatios:
    """Per-unit ratios ``candidate / baseline`` for the units both sides measured."""

    ratios: dict[Hashable, float]  # unit -> ratio
    missing: tuple[Hashable, ...]  # units with no positive value on one side (excluded)

    def __len__(self) -> int:
        return len(self.ratios)


def paired_ratios(baseline: Mapping[Hashable, float], candidate: Mapping[Hashable, float],
                  higher_is_better: bool = True) -> PairedRatios:
    """Pair two measurements by unit (prompt, turn) and take the speedup of each pair.

    For a rate (tokens/s) the speedup is candidate / baseline; for a time
    (``higher_is_better=False``) it is baseline / candidate, so > 1 always means faster.
    Units without a positive value on both sides are reported in ``missing``.
    """
    ratios: dict[Hashable, float] = {}
    missing = []
    for unit in sorted(set(baseline) | set(candidate), key=repr):
        b, c = baseline.get(unit), candidate.get(unit)
        if b is None or c is None or not b > 0 or not c > 0:
            missing.append(unit)
            continue
        ratios[unit] = c / b if higher_is_better else b / c
    return PairedRatios(ratios=ratios, missing=tuple(missing))


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int  # units (ratios) behind the estimate
    confidence: float


def bootstrap_ci(values: Sequence[float], clusters: Sequence[Hashable] | None = None,
                 statistic: Callable[[np.ndarray], float] = geometric_mean,
                 n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """Percentile bootstrap interval of ``statistic(values)``.

    ``clusters[i]`` names the group of ``values[i]`` (turns of one conversation);
    a resample draws whole clusters with replacement, so correlated values are
    not counted as independent evidence. With one cluster the interval collapses
    to the estimate: one prompt says nothing about spread.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    estimate = float(statistic(v))
    keys = list(clusters) if clusters is not None else list(range(v.size))
    if len(keys) != v.size:
        raise ValueError("clusters must name one group per value")
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    members = [np.asarray(ix) for ix in groups.values()]
    if len(members) < 2:
        return Interval(estimate, estimate, estimate, int(v.size), confidence)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(members), size=(n_resamples, len(members)))
    if statistic is geometric_mean:
        if np.any(v <= 0):
            raise ValueError("geometric mean needs positive values")
        # Vectorised: a resample's geometric mean is exp(sum of its clusters' log sums / count).
        log_sum = np.array([np.log(v[ix]).sum() for ix in members])
        count = np.array([ix.size for ix in members], dtype=np.float64)
        stats = np.exp(log_sum[picks].sum(axis=1) / count[picks].sum(axis=1))
    else:
        stats = np.array([statistic(v[np.concatenate([members[p] for p in pick])])
                          for pick in picks])
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return Interval(estimate, float(low), float(high), int(v.size), confidence)


def median(values) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else math.nan


def speedup(baseline: Mapping[Hashable, float], candidate: Mapping[Hashable, float],
            cluster_of: Callable[[Hashable], Hashable] = lambda u: u,
            higher_is_better: bool = True, n_resamples: int = 2000, confidence: float = 0.95,
            seed: int = 0, statistic: Callable[[np.ndarray], float] = geometric_mean
            ) -> tuple[Interval, PairedRatios]:
    """Paired speedup (geometric mean by default, or e.g. :func:`median`) with its bootstrap
    interval."""
    pr = paired_ratios(baseline, candidate, higher_is_better)
    units = list(pr.ratios)
    ci = bootstrap_ci([pr.ratios[u] for u in units], [cluster_of(u) for u in units],
                      statistic=statistic, n_resamples=n_resamples, confidence=confidence,
                      seed=seed)
    return ci, pr


def histogram_sum(hists: Sequence[Mapping[str, int]]) -> dict[int, int]:
    """Add accepted-length histograms (JSON keys are strings) into one, keyed by int."""
    out: dict[int, int] = {}
    for h in hists:
        for k, v in h.items():
            out[int(k)] = out.get(int(k), 0) + int(v)
    return dict(sorted(out.items()))


def histogram_mean(hist: Mapping[int, int]) -> float:
    n = sum(hist.values())
    return sum(k * v for k, v in hist.items()) / n if n else math.nan


# --- bounded latency histograms -------------------------------------------------------
#: Inter-token latencies are kept per request as a histogram, not a list (a run's memory must
#: not grow with its tokens): log bins of 10^(1/24) (about 10 % wide) from 10 µs up; bin -1
#: holds the zeros, tokens that arrived with the one before (the same verify pass).
ITL_BINS_PER_DECADE = 24
ITL_FLOOR = 1e-5


def latency_bin(seconds: float) -> int:
    if seconds < ITL_FLOOR:
        return -1
    return int(math.floor(math.log10(seconds / ITL_FLOOR) * ITL_BINS_PER_DECADE))


def bin_value(b: int) -> float:
    """A bin's representative latency: its geometric middle (0 for the zeros' bin)."""
    return 0.0 if b < 0 else ITL_FLOOR * 10 ** ((b + 0.5) / ITL_BINS_PER_DECADE)


def latency_histogram(times: Sequence[float]) -> dict[str, int]:
    """{bin: count} of the gaps between consecutive token times (JSON keys are strings)."""
    out: dict[str, int] = {}
    for a, b in zip(times, times[1:]):
        k = str(latency_bin(b - a))
        out[k] = out.get(k, 0) + 1
    return out


def histogram_percentile(hists: Sequence[Mapping[str, int]], q: float) -> float:
    """The q-th percentile of pooled latency histograms, to within a bin (about 10 %); the
    rank rule is :func:`percentile`'s lower neighbour. NaN for no values."""
    counts: dict[int, int] = {}
    for h in hists:
        for k, n in h.items():
            counts[int(k)] = counts.get(int(k), 0) + int(n)
    total = sum(counts.values())
    if not total:
        return math.nan
    rank = int(math.floor((total - 1) * q / 100.0))
    seen = 0
    for b in sorted(counts):
        seen += counts[b]
        if seen > rank:
            return bin_value(b)
    return bin_value(max(counts))  # pragma: no cover - the loop always returns
