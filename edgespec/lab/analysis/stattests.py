"""Chi-square tests for the parity checks, with no dependency beyond the stdlib.

A test "fails" when its p-value is below ``alpha``; for a correct
implementation that happens with probability ``alpha`` (the false-alarm rate),
provided every expected cell count is large enough for the chi-square
approximation. Cells with small expectation are pooled until each holds at
least ``min_expected`` (5, the usual rule).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

_EPS = 1e-15
_MAX_ITER = 10_000


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    df: int
    p_value: float

    def rejects(self, alpha: float) -> bool:
        return self.p_value < alpha


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularised upper incomplete gamma Q(df/2, x/2)."""
    if df <= 0:
        raise ValueError(f"df must be positive (got {df})")
    if x <= 0.0:
        return 1.0
    a, z = df / 2.0, x / 2.0
    log_prefactor = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:
        # series for the lower function P(a, z) = z^a e^-z / Gamma(a+1) * sum z^n / ((a+1)...(a+n))
        term = total = 1.0 / a
        n = a
        for _ in range(_MAX_ITER):
            n += 1.0
            term *= z / n
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    # continued fraction for Q(a, z) (modified Lentz), converges fast for z >= a + 1
    tiny = 1e-300
    b = z + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(log_prefactor) * h


def goodness_of_fit(observed: Sequence[int], probs: Sequence[float], min_expected: float = 5.0) -> ChiSquare:
    """Do ``observed`` counts come from ``probs``? (Pearson chi-square, pooled small cells.)

    A count in a zero-probability cell is an outright mismatch (p-value 0).
    """
    obs = np.asarray(observed, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    if obs.shape != p.shape:
        raise ValueError("observed and probs must have the same shape")
    if np.any(obs[p <= 0.0] > 0):
        return ChiSquare(math.inf, max(1, int((p > 0).sum()) - 1), 0.0)
    n = obs.sum()
    exp = p / p.sum() * n
    obs_cells, exp_cells = _pool(obs, exp, min_expected)
    if len(exp_cells) < 2:
        return ChiSquare(0.0, 1, 1.0)
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    df = len(exp_cells) - 1
    return ChiSquare(stat, df, chi2_sf(stat, df))


def homogeneity(counts_a: Sequence[int], counts_b: Sequence[int], min_expected: float = 5.0) -> ChiSquare:
    """Do two samples of categories come from the same distribution? (2 x C contingency test.)"""
    a = np.asarray(counts_a, dtype=np.float64)
    b = np.asarray(counts_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError("both samples must count the same categories")
    na, nb = a.sum(), b.sum()
    if na == 0 or nb == 0:
        raise ValueError("both samples must be non-empty")
    col = a + b
    live = col > 0
    a, b, col = a[live], b[live], col[live]
    # pool on the smaller sample's expectation so both rows satisfy the rule
    share = min(na, nb) / (na + nb)
    order = np.argsort(col, kind="stable")
    groups = _pool_groups(col[order] * share, min_expected)
    if len(groups) < 2:
        return ChiSquare(0.0, 1, 1.0)
    ga = np.array([a[order[g]].sum() for g in groups])
    gb = np.array([b[order[g]].sum() for g in groups])
    gc = ga + gb
    ea, eb = gc * na / (na + nb), gc * nb / (na + nb)
    stat = float(((ga - ea) ** 2 / ea).sum() + ((gb - eb) ** 2 / eb).sum())
    df = len(groups) - 1
    return ChiSquare(stat, df, chi2_sf(stat, df))


def _pool(obs: np.ndarray, exp: np.ndarray, min_expected: float) -> tuple[np.ndarray, np.ndarray]:
    live = exp > 0
    obs, exp = obs[live], exp[live]
    order = np.argsort(exp, kind="stable")
    groups = _pool_groups(exp[order], min_expected)
    return (np.array([obs[order[g]].sum() for g in groups]),
            np.array([exp[order[g]].sum() for g in groups]))


def _pool_groups(sorted_exp: np.ndarray, min_expected: float) -> list[np.ndarray]:
    """Merge ascending cells left to right until each group reaches min_expected; a short tail joins the last."""
    groups: list[list[int]] = []
    cur: list[int] = []
    acc = 0.0
    for i, e in enumerate(sorted_exp):
        cur.append(i)
        acc += e
        if acc >= min_expected:
            groups.append(cur)
            cur, acc = [], 0.0
    if cur:
        if groups:
            groups[-1].extend(cur)
        else:
            groups.append(cur)
    return [np.asarray(g, dtype=np.int64) for g in groups]
