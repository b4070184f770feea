"""verify.py on draft trees: literal greedy walks, and statistical proof that recursive
rejection sampling over siblings keeps the target's law (same conventions as
test_verify.py: fixed seeds, ALPHA false-alarm rate, DETECT for the broken variant)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.sampling import make_rng, sample
from fakes.chains import LENGTH, V, chain, joint_counts, joint_probs
from edgespec.lab.analysis.stattests import goodness_of_fit
from edgespec.decoding.verify import (TreeVerdict, verify_greedy, verify_sampling,
                                      verify_tree_greedy, verify_tree_sampling)

ALPHA = 1e-3
DETECT = 1e-6

#        root
#       /    \
#     5(0)   6(1)
#     |      /  \
#    7(2)  7(3) 8(4)
TOKENS = [5, 7, 6, 7, 8]
PARENTS = [-1, 0, -1, 2, 2]


@pytest.mark.parametrize("argmax, expected", [
    ([5, 7, 0, 0, 0, 0], ((0, 1), 0)),      # first branch to its leaf, bonus from its row
    ([6, 0, 0, 8, 0, 3], ((2, 4), 3)),      # second branch, second child, bonus 3
    ([6, 0, 0, 9, 0, 0], ((2,), 9)),        # second branch, then the target leaves the tree
    ([4, 7, 7, 7, 7, 7], ((), 4)),          # no root child matches: a plain step's token
])
def test_tree_greedy_walks_the_targets_argmax(argmax, expected):
    assert verify_tree_greedy(TOKENS, PARENTS, argmax) == TreeVerdict(*expected)


def test_chain_tree_is_linear_verification():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(0, 6))
        draft = rng.integers(0, 3, size=k).tolist()
        argmax = rng.integers(0, 3, size=k + 1).tolist()
        v = verify_tree_greedy(draft, list(range(-1, k - 1)), argmax)
        assert (v.n_accepted, v.next_token) == tuple(verify_greedy(draft, argmax))
        assert v.path == tuple(range(v.n_accepted))


@pytest.mark.parametrize("parents", [[0], [-1, 2, -1], [-2]])
def test_parents_must_precede_children(parents):
    with pytest.raises(ValueError, match="parents must come before"):
        verify_tree_greedy([1] * len(parents), parents, [0] * (len(parents) + 1))


def test_row_counts_are_checked():
    with pytest.raises(ValueError, match="target rows"):
        verify_tree_greedy(TOKENS, PARENTS, [0] * 5)
    with pytest.raises(ValueError, match="target rows"):
        verify_tree_sampling(TOKENS, PARENTS, None, np.ones((5, 9)), make_rng(0))
    with pytest.raises(ValueError, match="draft_probs"):
        verify_tree_sampling(TOKENS, PARENTS, np.ones((4, 9)), np.ones((6, 9)), make_rng(0))


def test_one_hot_target_sampling_equals_greedy():
    eye = np.eye(10)
    rng = make_rng(1)
    for argmax in ([5, 7, 0, 0, 0, 0], [6, 0, 0, 8, 0, 3], [6, 0, 0, 9, 0, 0], [4] * 6):
        rows = eye[argmax]
        want = verify_tree_greedy(TOKENS, PARENTS, argmax)
        assert verify_tree_sampling(TOKENS, PARENTS, None, rows, rng) == want
        q = np.full((len(TOKENS), 10), 0.1)
        assert verify_tree_sampling(TOKENS, PARENTS, q, rows, rng) == want


def test_point_mass_tree_reproduces_plain_sampling_token_for_token():
    """One uniform per emitted token, as plain sampling: same seed, same tokens."""
    P = chain(41)
    n_tokens = 300
    rng = make_rng(7)
    plain, prev = [], 0
    for _ in range(n_tokens):
        prev = sample(P[prev], rng)
        plain.append(prev)
    rng, guess = make_rng(7), np.random.default_rng(0)
    seq = [0]
    while len(seq) <= n_tokens:
        toks, parents = _random_tree(guess, seq[-1])
        rows = _tree_rows(P, seq[-1], toks, parents)
        path, nxt = verify_tree_sampling(toks, parents, None, rows, rng)
        seq += [toks[i] for i in path] + [nxt]
    assert seq[1: n_tokens + 1] == plain


# --- the emitted law equals the target's -------------------------------------------------





def _random_tree(rng, last):
    """A random tree of up to 6 nodes in depth-first order (point-mass drafts)."""
    toks, parents = [], []

    def grow(parent, depth):
        for _ in range(int(rng.integers(0, 3 if depth < 3 else 1))):
            if len(toks) >= 6:
                return
            toks.append(int(rng.integers(0, V)))
            parents.append(parent)
            grow(len(toks) - 1, depth + 1)

    grow(-1, 0)
    return toks, parents


def _tree_rows(P, last, toks, parents):
    """Row 0: the law after `last`; row i + 1: the law after node i's token."""
    del parents  # a Markov chain's law depends on the last token only
    return P[[last, *toks]]


def _sampled_tree(Q, last, width, depth, rng, mode):
    """`width` branches of `depth` tokens. mode "model": root children i.i.d. from Q[last],
    each continued by sampling (q rows returned); "point": Q's top-`width` tokens,
    continued greedily (no q rows)."""
    toks, parents, qrows = [], [], []
    if mode == "model":
        firsts = [sample(Q[last], rng) for _ in range(width)]
    else:
        firsts = [int(t) for t in np.argsort(-Q[last], kind="stable")[:width]]
    for x in firsts:
        parent, prev, row = -1, last, Q[last]
        for d in range(depth):
            if d > 0:
                row = Q[prev]
                x = sample(row, rng) if mode == "model" else int(np.argmax(row))
            toks.append(x)
            parents.append(parent)
            qrows.append(row)
            parent, prev = len(toks) - 1, x
    return toks, parents, (np.stack(qrows) if mode == "model" and toks else None)


def _speculate(P, Q, width, depth, runs, seed, mode, residual=True):
    rng, draft_rng = make_rng(seed), make_rng(seed, "draft")
    out = np.empty((runs, LENGTH), dtype=np.int64)
    for r in range(runs):
        seq = [0]
        while len(seq) <= LENGTH:
            toks, parents, q = _sampled_tree(Q, seq[-1], width, depth, draft_rng, mode)
            rows = _tree_rows(P, seq[-1], toks, parents)
            path, nxt = verify_tree_sampling(toks, parents, q, rows, rng, residual=residual)
            seq += [toks[i] for i in path] + [nxt]
        out[r] = seq[1: LENGTH + 1]
    return out






@pytest.mark.parametrize("mode, width, depth, zeros, seed", [
    ("model", 2, 2, False, 11),
    ("model", 3, 1, True, 12),
    ("point", 2, 2, False, 13),
    ("point", 3, 2, True, 14),
])
def test_tree_sampling_preserves_the_target_law(mode, width, depth, zeros, seed):
    P, Q = chain(seed, zeros), chain(seed + 100)
    samples = _speculate(P, Q, width, depth, runs=10_000, seed=seed, mode=mode)
    res = goodness_of_fit(joint_counts(samples), joint_probs(P))
    assert not res.rejects(ALPHA), res


@pytest.mark.parametrize("mode", ["model", "point"])
def test_siblings_without_the_residual_are_detected(mode):
    P, Q = chain(21), chain(121)
    samples = _speculate(P, Q, 3, 1, runs=10_000, seed=21, mode=mode, residual=False)
    res = goodness_of_fit(joint_counts(samples), joint_probs(P))
    assert res.rejects(DETECT), res


def test_chain_tree_sampling_matches_linear_sampling_law():
    """A width-1 tree is linear speculative sampling: same rows, same seed, same verdict."""
    P, Q = chain(31), chain(131)
    draft_rng = make_rng(3, "draft")
    for _ in range(300):
        toks, parents, q = _sampled_tree(Q, 0, 1, 3, draft_rng, "model")
        rows = _tree_rows(P, 0, toks, parents)
        a = verify_tree_sampling(toks, parents, q, rows, make_rng(5))
        b = verify_sampling(toks, q, rows, make_rng(5))
        assert (a.n_accepted, a.next_token) == tuple(b)
