"""A Markov chain as a target law, for the statistical tests of speculative sampling.

A V-token chain is small enough that the exact joint law of the first LENGTH emitted tokens
can be enumerated (V ** LENGTH cells) and compared with sampled counts by a goodness-of-fit
test: the chain stands in for a model whose next-token law depends on the last token only.
"""
from __future__ import annotations

import itertools

import numpy as np

V = 5
LENGTH = 3  # compare the joint law of the first three emitted tokens: 125 cells


def chain(seed: int, zeros: bool = False) -> np.ndarray:
    """A random V x V transition matrix; ``zeros`` makes some tokens impossible in some
    contexts (top-k style truncation)."""
    rng = np.random.default_rng(seed)
    m = rng.dirichlet(np.full(V, 0.7), size=V)
    if zeros:
        m[rng.random((V, V)) < 0.3] = 0.0
        m[np.arange(V), np.arange(V)] += 0.05
        m /= m.sum(axis=1, keepdims=True)
    return m


def joint_probs(P: np.ndarray) -> np.ndarray:
    """The exact law of the first LENGTH tokens after token 0, flattened."""
    probs = np.zeros((V,) * LENGTH)
    for idx in itertools.product(range(V), repeat=LENGTH):
        prev, pr = 0, 1.0
        for t in idx:
            pr *= P[prev, t]
            prev = t
        probs[idx] = pr
    return probs.ravel()


def joint_counts(samples: np.ndarray) -> np.ndarray:
    """Counts of each LENGTH-token sequence in ``samples`` (runs x LENGTH), flattened."""
    return np.bincount(np.ravel_multi_index(samples.T, (V,) * LENGTH), minlength=V ** LENGTH)
