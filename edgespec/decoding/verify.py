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

Coupled drafts (sampling.py's RNG policy): the request hands verification a cursor
over uniforms keyed by position, so the point-mass rule's draw at position ``n`` is
``icdf(p_n, u_n)``, the plain path's own draw there. A draft model drew its token as
``icdf(q_n, u_n)`` with the *same* ``u_n`` and is verified as a point mass: accepting
iff the two agree emits ``icdf(p_n, u_n)`` at every position whatever the draft, so
the output is plain sampling's token for token; the draft decides only how many
positions one pass settles.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence, TypeVar

import numpy as np

from ..api.arrays import FloatArray
from .sampling import Uniforms, sample


_Row = TypeVar("_Row", covariant=True)


class Rows(Protocol[_Row]):
    """The target's rows as verification reads them: a list or an array, or a lazy view
    that computes row ``i`` only when read (rows past a rejection are never read)."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> _Row: ...


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
    draft_probs: FloatArray | None,
    target_probs: Rows[FloatArray],
    rng: Uniforms,
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


# --- draft trees -------------------------------------------------------------------------
# A tree is flat: node i holds tokens[i] and parents[i] (-1: a child of the root, the last
# emitted token), parents before children (edgespec.decoding.tree.DraftTree keeps depth-first order).
# Target rows: row 0 is the root's distribution, row i + 1 node i's.

class TreeVerdict(NamedTuple):
    path: tuple[int, ...]  # accepted nodes, root to deepest
    next_token: int  # recovered (left the tree) or bonus (at a leaf)

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def _children(parents: Sequence[int]) -> list[list[int]]:
    """kids[v + 1]: the children of node v (v = -1: the root), in index order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        p = int(p)
        if not -1 <= p < i:
            raise ValueError(f"node {i} has parent {p}: parents must come before their children")
        kids[p + 1].append(i)
    return kids


def verify_tree_greedy(tokens: Sequence[int], parents: Sequence[int],
                       target_argmax: Rows[int]) -> TreeVerdict:
    """Follow the target's argmax down the tree; the first argmax no child holds is emitted.

    ``target_argmax`` has ``len(tokens) + 1`` entries (row 0: the root). Example, root
    children ``5`` (node 0) and ``6`` (node 1), node 2 = ``7`` under node 1; argmax
    ``[6, 0, 7, 9]`` -> ``TreeVerdict((1, 2), 9)``: the target took the second branch to
    its end, and 9 is the bonus token. A chain tree is :func:`verify_greedy`.
    """
    if len(target_argmax) != len(tokens) + 1:
        raise ValueError(f"{len(target_argmax)} target rows for a tree of {len(tokens)} nodes: "
                         f"need {len(tokens) + 1}")
    kids = _children(parents)
    path: list[int] = []
    v = -1
    while True:
        y = int(target_argmax[v + 1])
        nxt = next((c for c in kids[v + 1] if int(tokens[c]) == y), None)
        if nxt is None:
            return TreeVerdict(tuple(path), y)
        path.append(nxt)
        v = nxt


def verify_tree_sampling(tokens: Sequence[int], parents: Sequence[int],
                         draft_probs: FloatArray | None, target_probs: Rows[FloatArray],
                         rng: Uniforms, *, residual: bool = True) -> TreeVerdict:
    """Recursive rejection sampling over siblings (SpecInfer's multi-step speculative
    sampling; Sequoia's for drafts without a distribution): the emitted tokens are
    distributed as plain sampling, whatever the tree.

    At node ``v`` with target law ``p`` and children ``x_1 .. x_m`` (``x_j`` drawn
    independently from ``q_j``, the row ``draft_probs[child]``), try the children in
    order: accept ``x_j`` with probability ``min(1, p_{j-1}(x_j) / q_j(x_j))`` and descend
    into it (its own children are then tried against the target's row at ``x_j``);
    on rejection ``p_j = norm(max(p_{j-1} - q_j, 0))``; when every child is rejected,
    emit a token drawn from ``p_m`` (at a leaf, m = 0: the bonus token from ``p``).

    Why the law is the target's (induction on m): with m = 0 the token is drawn from
    ``p``. Otherwise ``P(y) = min(p(y), q_1(y)) + (1 - sum_z min(p(z), q_1(z))) * P'(y)``,
    where ``P'`` is the law the remaining m - 1 children produce from ``p_1``; they are
    independent of ``x_1``, so by induction ``P' = p_1`` and, because
    ``1 - sum_z min(p, q_1)(z) = sum_z max(p - q_1, 0)(z)`` is exactly ``p_1``'s
    normaliser, ``P(y) = min(p, q_1)(y) + max(p - q_1, 0)(y) = p(y)``. The token chosen at
    ``v`` is therefore distributed as the target's next token, and descending into the
    accepted child repeats the argument one position later, conditioned on the path so
    far: the whole emitted sequence has the plain sampling law (for a chain this is
    :func:`verify_sampling`).

    ``draft_probs=None`` (point-mass drafts: suffix trees, n-gram tables) has
    ``q_j = delta(x_j)``: accept with ``p_{j-1}(x_j)``, else remove ``x_j`` from ``p`` and
    renormalise. Drawing ``y ~ p`` once and descending into the child holding ``y`` (or
    emitting ``y`` when none does) has exactly that law and uses one uniform per emitted
    token, as plain sampling does: with the same seed and rows it emits plain sampling's
    tokens. ``residual=False`` is a deliberately wrong variant (siblings after a rejection
    are tried against ``p`` instead of the residual) for the tests to catch.
    """
    n = len(tokens)
    if len(target_probs) != n + 1:
        raise ValueError(f"{len(target_probs)} target rows for a tree of {n} nodes: need {n + 1}")
    if draft_probs is not None and len(draft_probs) != n:
        raise ValueError(f"draft_probs has {len(draft_probs)} rows for {n} tree nodes")
    kids = _children(parents)
    path: list[int] = []
    v = -1
    while True:
        nxt, y = _tree_node(tokens, kids[v + 1], draft_probs, target_probs[v + 1], rng, residual)
        if nxt is None:
            return TreeVerdict(tuple(path), y)
        path.append(nxt)
        v = nxt


def _tree_node(tokens: Sequence[int], children: list[int], draft_probs: FloatArray | None,
               p: FloatArray, rng: Uniforms, residual: bool) -> tuple[int | None, int]:
    """One node of :func:`verify_tree_sampling`: (the child to descend into, its token), or
    (None, the token emitted here) when every child is rejected."""
    if draft_probs is None:
        if residual:
            # one draw from p decides which child (if any) is accepted, or is the token
            y = sample(p, rng)
            return next((c for c in children if int(tokens[c]) == y), None), y
        q_rows = [np.eye(1, p.shape[0], int(tokens[c]))[0] for c in children]
    else:
        q_rows = [draft_probs[c] for c in children]
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    for c, q in zip(children, q_rows):
        x = int(tokens[c])
        if rng.random() * q[x] < p[x]:  # P = min(1, p(x) / q(x))
            return c, x
        if residual:
            r = np.maximum(p - q, 0.0)
            s = r.sum()
            # s == 0 only when p == q, where rejection has probability 0 (a float tie)
            if s > 0.0:
                p = r / s
    return None, sample(p, rng)
