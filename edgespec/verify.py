"""Verification: which drafted tokens the target accepts, and the token it adds.

Vocabulary (as in vLLM's rejection sampler):

* **draft tokens** ``x_0 .. x_{k-1}``: what a proposer suggested;
* **accepted** tokens: the longest prefix of the draft the target keeps;
* the **recovered** token: at the first rejected position ``i`` the target
  emits its own token instead, drawn from the *residual* distribution;
* the **bonus** token: when all ``k`` are accepted, the target's logits at the
  last position (computed in the same verify pass) give one more token.

Every step therefore emits ``n_accepted + 1`` tokens. The target is evaluated
once over ``[last emitted token] + draft``, giving ``k + 1`` rows: row ``i``
is the target's distribution for the position of ``x_i`` (row ``k`` is the
bonus position). Rows must be exactly what plain sampling would use at that
position, i.e. ``sampling.distribution`` with the history extended by the
draft tokens before it (penalties see accepted draft tokens).

Greedy: ``x_i`` is accepted iff it equals the target's argmax at row ``i``;
the next token is the argmax at the first mismatch (or at row ``k``). The
output is the plain greedy output whenever the rows are bitwise equal to the
plain path's logits.

Sampling (Leviathan et al. 2023; Chen et al. 2023), ``p`` the target row,
``q`` the draft's distribution that ``x_i`` was *actually sampled from*:
accept ``x_i`` with probability ``min(1, p(x_i) / q(x_i))``; at the first
rejection emit a token from the residual ``norm(max(0, p - q))``. Then
``P(emit y) = min(p(y), q(y)) + (1 - sum_z min(p(z), q(z))) * residual(y) = p(y)``:
the emitted sequence has exactly the plain sampling distribution, whatever q is.

A point-mass draft (``q = delta_x``, proposers without a distribution, or a
greedy draft model) reduces to: accept with probability ``p(x)``, else draw
from ``p`` with ``x`` removed, renormalised. Drawing ``y ~ p`` and accepting
iff ``y == x`` (emitting ``y`` otherwise) has exactly that law, and consumes
one uniform per emitted token like plain sampling; that is what is done here.

A draft model that picks argmax tokens but reports its softmax as ``q`` would
make the rule above wrong; such a drafter must pass ``draft_probs=None``.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from .sampling import sample


class Verdict(NamedTuple):
    n_accepted: int  # leading draft tokens kept
    next_token: int  # the recovered token (after a rejection) or the bonus token


def verify_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """Longest prefix of the draft equal to the target's argmax, plus the target's next token.

    ``target_argmax[i]`` is the target's greedy choice at draft position ``i``:
    ``len(draft) + 1`` entries, or fewer if they stop at the first mismatch
    (later rows cannot matter, so a caller may skip computing them).
    Example: draft ``[5, 7, 9]``, argmax ``[5, 7, 2, 4]`` (or just ``[5, 7, 2]``)
    -> ``Verdict(2, 2)``: two accepted, 2 recovered.
    """
    k = len(draft_tokens)
    t = np.asarray(target_argmax, dtype=np.int64)
    m = min(k, t.shape[0])
    miss = np.flatnonzero(np.asarray(draft_tokens[:m], dtype=np.int64) != t[:m])
    if miss.size:
        n = int(miss[0])
    elif t.shape[0] == k + 1:
        n = k
    else:
        raise ValueError(f"{t.shape[0]} target rows for {k} draft tokens: need {k + 1}, "
                         "or rows up to the first mismatch")
    return Verdict(n, int(t[n]))


def verify_sampling(
    draft_tokens: Sequence[int],
    draft_probs: np.ndarray | None,
    target_probs: Sequence[np.ndarray],
    rng: np.random.Generator,
    *,
    residual: bool = True,
) -> Verdict:
    """Speculative sampling over one draft; the emitted tokens are distributed as plain sampling.

    ``draft_probs``: ``(k, V)`` rows ``q_i`` the draft tokens were sampled from,
    or ``None`` for a point-mass draft. ``target_probs``: ``k + 1`` rows ``p_i``
    (anything indexable; rows past the first rejection are never read, so a
    lazy sequence can skip computing them).

    ``residual=False`` is a deliberately *wrong* variant (on rejection it draws
    from ``p`` instead of the residual, so rejected tokens come back too often);
    it exists only so tests and the parity harness can show they catch it.
    """
    k = len(draft_tokens)
    if draft_probs is not None and len(draft_probs) != k:
        raise ValueError(f"draft_probs has {len(draft_probs)} rows for {k} draft tokens")

    for i, x in enumerate(draft_tokens):
        p = target_probs[i]
        if draft_probs is None:
            if residual:
                # one draw from p decides acceptance and, on rejection, is the recovered token
                y = sample(p, rng)
                if y != x:
                    return Verdict(i, y)
                continue
            if rng.random() < p[x]:
                continue
            return Verdict(i, sample(p, rng))  # broken: x itself can come back
        q = draft_probs[i]
        if rng.random() * q[x] < p[x]:  # P = min(1, p(x) / q(x))
            continue
        if not residual:
            return Verdict(i, sample(p, rng))  # broken: ignores what q already covered
        r = np.maximum(p - q, 0.0)
        # r sums to 0 only when p == q, where rejection has probability 0 (a float tie)
        return Verdict(i, sample(r if r.sum() > 0.0 else p, rng))
    return Verdict(k, sample(target_probs[k], rng))
