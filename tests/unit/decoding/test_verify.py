"""verify.py: literal cases, and statistical proof that speculative sampling preserves the target law.

Statistical assertions use fixed seeds, so they are deterministic; the stated
false-alarm rate (ALPHA) is the chance that a correct implementation would fail
one of them for a seed picked at random. The broken variant (no residual) must
be rejected at a far smaller p-value (DETECT), so detection is not luck.
"""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.sampling import make_rng, sample
from fakes.chains import LENGTH, V, chain, joint_counts, joint_probs
from edgespec.lab.analysis.stattests import goodness_of_fit, homogeneity
from edgespec.decoding.verify import Verdict, verify_greedy, verify_sampling

ALPHA = 1e-3
DETECT = 1e-6


# --- greedy --------------------------------------------------------------------------------

@pytest.mark.parametrize("draft, argmax, expected", [
    ([5, 7, 9], [5, 7, 9, 4], (3, 4)),   # all accepted, 4 is the bonus token
    ([5, 7, 9], [5, 7, 2, 4], (2, 2)),   # rejected at 2, the target's 2 is recovered
    ([5, 7, 9], [1, 7, 9, 4], (0, 1)),   # first token rejected
    ([5, 7, 9], [5, 7, 2], (2, 2)),      # rows may stop at the first mismatch
    ([], [3], (0, 3)),                   # empty draft: a plain step
])
def test_verify_greedy_literal(draft, argmax, expected):
    assert verify_greedy(draft, argmax) == Verdict(*expected)


def test_verify_greedy_needs_rows_up_to_a_mismatch():
    with pytest.raises(ValueError, match="target rows"):
        verify_greedy([5, 7, 9], [5, 7, 9])


# --- sampling: literal / deterministic cases ---------------------------------------------------

def test_identical_draft_and_target_always_accept():
    p = np.array([0.2, 0.3, 0.5])
    rng = make_rng(0)
    for _ in range(200):
        x = [int(rng.integers(3)), int(rng.integers(3))]
        assert verify_sampling(x, np.stack([p, p]), np.stack([p, p, p]), rng).n_accepted == 2


def test_token_the_target_forbids_is_always_rejected_and_never_emitted():
    p = np.array([0.0, 0.6, 0.4])
    q = np.array([0.9, 0.05, 0.05])
    rng = make_rng(1)
    for _ in range(300):
        n, y = verify_sampling([0], q[None], np.stack([p, p]), rng)
        assert n == 0 and y != 0
    for _ in range(300):  # point-mass draft too
        n, y = verify_sampling([0], None, np.stack([p, p]), rng)
        assert n == 0 and y != 0


def test_one_hot_target_matches_greedy_verification():
    rng = make_rng(2)
    eye = np.eye(4)
    for draft, argmax in [([1, 2, 3], [1, 2, 0, 3]), ([1, 2], [1, 2, 3]), ([0], [2, 1])]:
        rows = eye[argmax]
        assert verify_sampling(draft, None, rows, rng) == verify_greedy(draft, argmax)
        q = np.full((len(draft), 4), 0.25)
        assert verify_sampling(draft, q, rows, rng) == verify_greedy(draft, argmax)


def test_rows_past_the_first_rejection_are_never_read():
    class Lazy:
        def __init__(self):
            self.read = []

        def __getitem__(self, i):
            self.read.append(i)
            return np.array([0.0, 1.0]) if i == 0 else np.array([0.5, 0.5])

    rows = Lazy()
    assert verify_sampling([0, 0, 0], None, rows, make_rng(3)) == (0, 1)
    assert rows.read == [0]


def test_draft_probs_row_count_is_checked():
    with pytest.raises(ValueError, match="draft_probs"):
        verify_sampling([0, 1], np.ones((1, 2)) / 2, np.ones((3, 2)) / 2, make_rng(0))


# --- sampling: the emitted law equals the target's -------------------------------------------
# A toy "language model": the next-token law depends on the previous token
# (a Markov chain). Target P and draft Q are unrelated random chains.





def _speculate(P, Q, k, runs, seed, draft_mode, residual=True):
    """First LENGTH tokens of `runs` speculative generations from start token 0."""
    rng, draft_rng = make_rng(seed), make_rng(seed, "draft")
    out = np.empty((runs, LENGTH), dtype=np.int64)
    for r in range(runs):
        seq = [0]
        while len(seq) <= LENGTH:
            toks, qrows = [], []
            last = seq[-1]
            for _ in range(k):
                if draft_mode == "model":
                    x = sample(Q[last], draft_rng)
                    qrows.append(Q[last])
                elif draft_mode == "greedy":
                    x = int(np.argmax(Q[last]))
                else:  # "fixed": a proposer that always guesses token 1 (an n-gram miss)
                    x = 1
                toks.append(x)
                last = x
            ctx = [seq[-1], *toks]
            rows = P[ctx]  # row i: target law after seq + toks[:i]
            n, nxt = verify_sampling(toks, np.stack(qrows) if qrows else None, rows, rng,
                                     residual=residual)
            seq += [*toks[:n], nxt]
        out[r] = seq[1: LENGTH + 1]
    return out






@pytest.mark.parametrize("draft_mode, k, zeros, seed", [
    ("model", 1, False, 11),
    ("model", 3, False, 12),
    ("model", 4, True, 13),
    ("greedy", 3, False, 14),
    ("fixed", 2, True, 15),
])
def test_speculative_sampling_preserves_the_target_law(draft_mode, k, zeros, seed):
    P, Q = chain(seed, zeros), chain(seed + 100)
    samples = _speculate(P, Q, k, runs=12_000, seed=seed, draft_mode=draft_mode)
    res = goodness_of_fit(joint_counts(samples), joint_probs(P))
    assert not res.rejects(ALPHA), res


@pytest.mark.parametrize("draft_mode, k", [("model", 3), ("greedy", 2)])
def test_broken_acceptance_without_residual_is_detected(draft_mode, k):
    P, Q = chain(21), chain(121)
    samples = _speculate(P, Q, k, runs=12_000, seed=21, draft_mode=draft_mode, residual=False)
    res = goodness_of_fit(joint_counts(samples), joint_probs(P))
    assert res.rejects(DETECT), res


def test_two_sample_homogeneity_separates_correct_from_broken():
    """The form the parity harness uses: plain samples vs speculative samples, no known law."""
    P, Q = chain(31), chain(131)
    rng = make_rng(31, "draft")
    plain = np.empty((8_000, LENGTH), dtype=np.int64)
    for r in range(8_000):
        prev = 0
        for j in range(LENGTH):
            prev = plain[r, j] = sample(P[prev], rng)
    good = _speculate(P, Q, 3, runs=8_000, seed=32, draft_mode="model")
    bad = _speculate(P, Q, 3, runs=8_000, seed=33, draft_mode="model", residual=False)
    assert not homogeneity(joint_counts(plain), joint_counts(good)).rejects(ALPHA)
    assert homogeneity(joint_counts(plain), joint_counts(bad)).rejects(DETECT)


def test_point_mass_drafts_reproduce_plain_sampling_token_for_token():
    """Same seed, same rows: an n-gram-style speculative run emits exactly the plain run's tokens."""
    P = chain(41, zeros=True)
    n_tokens = 400

    rng = make_rng(7)
    plain, prev = [], 0
    for _ in range(n_tokens):
        prev = sample(P[prev], rng)
        plain.append(prev)

    rng = make_rng(7)
    guess = np.random.default_rng(0)
    seq = [0]
    while len(seq) <= n_tokens:
        toks = guess.integers(0, V, size=int(guess.integers(1, 5))).tolist()
        n, nxt = verify_sampling(toks, None, P[[seq[-1], *toks]], rng)
        seq += [*toks[:n], nxt]
    assert seq[1: n_tokens + 1] == plain
