"""Same request, same text (issue #43 item 8): randomness keyed by (seed, position), so what
the controller drafts (nothing, point masses, a draft model, k = 1 or 4) never changes a
sampled text given the same logits. On the fake backend (tests/fakes/backend.py)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.decoding import sampling, verify
from edgespec.decoding.sampling import KeyedUniforms, sample_at
from edgespec.proposers.draft import DraftModelProposer
from fakes import EOG, FakeModel, ScriptedProposer, fake_engine, fixed

NO_EOG = tuple((t, float("-inf")) for t in sorted(EOG))
MIXED = [(1, 2), 3, None, (0, 1), 2, (2, 3), 1]


# --- the keyed uniforms -------------------------------------------------------------------
def test_a_positions_uniform_depends_on_the_seed_and_the_position_only():
    a, b = KeyedUniforms(7), KeyedUniforms(7)
    us = [a.at(n) for n in range(50)]
    assert [b.at(n) for n in reversed(range(50))] == us[::-1]  # order of asking is irrelevant
    assert all(0.0 <= u < 1.0 for u in us) and len(set(us)) == 50
    assert [KeyedUniforms(8).at(n) for n in range(50)] != us
    # the streams are distinct, and a cursor reads the target stream from its position on
    assert a.at(3, "draft") != a.at(3)
    cur = a.cursor(10)
    assert [cur.random() for _ in range(3)] == us[10:13] and cur.position == 13
    # a step's own generator is keyed by its first position: reproducible, not the cursor's
    assert a.step(5).random() == b.step(5).random() != a.step(6).random()
    with pytest.raises(ValueError, match="before the first"):
        a.at(-1)


def test_no_seed_draws_a_fresh_seed_once_and_keeps_it():
    k = KeyedUniforms(None)
    assert KeyedUniforms(k.seed).at(4) == k.at(4)
    assert KeyedUniforms(None).seed != k.seed


def test_sample_at_is_the_inverse_cdf_and_sample_reads_one_uniform():
    p = np.array([0.2, 0.0, 0.5, 0.3])
    assert [sample_at(p, u) for u in (0.0, 0.19, 0.2, 0.69, 0.7, 0.999)] == [0, 0, 2, 2, 3, 3]
    assert sample_at(p * 10, 0.5) == 2  # need not be normalised
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        sample_at(p, 1.0)
    cur = KeyedUniforms(3).cursor(0)
    assert sampling.sample(p, cur) == sample_at(p, KeyedUniforms(3).at(0)) and cur.position == 1


# --- point-mass verification on literal arrays and explicit uniforms -------------------------
ROWS = [np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.2, 0.8])]


class Given:
    """Explicit uniforms, one per ``random()``, and how many were read."""

    def __init__(self, us):
        self.us, self.read = list(us), 0

    def random(self):
        self.read += 1
        return self.us[self.read - 1]


def coupled(draft, rows, us):
    return verify.verify_sampling(draft, None, rows, Given(us))


@pytest.mark.parametrize("draft, us, verdict", [
    ([1, 0], [0.3, 0.2, 0.9], (2, 2)),   # both agree with the target's draws; bonus icdf(.9) = 2
    ([1, 1], [0.3, 0.2, 0.9], (1, 0)),   # the second disagrees: the target's own draw, 0
    ([2, 0], [0.3, 0.2, 0.9], (0, 1)),   # the first: icdf([.1,.6,.3], .3) = 1
    ([], [0.05], (0, 0)),                # no draft: a plain step
])
def test_a_point_mass_is_accepted_exactly_where_it_equals_the_targets_draw(draft, us, verdict):
    u = Given(us)
    assert verify.verify_sampling(draft, None, ROWS, u) == verify.Verdict(*verdict)
    assert u.read == verdict[0] + 1  # one uniform per emitted token, the next position's next


def test_the_emitted_tokens_are_the_plain_draws_whatever_the_draft():
    # with u_i the uniform of position i, the tokens are icdf(p_i, u_i), for every draft
    us = [0.3, 0.7, 0.9]
    plain = [sample_at(r, u) for r, u in zip(ROWS, us)]
    for draft in ([0, 0], [1, 0], [1, 1], [1, 2], [2, 2]):
        n, y = coupled(draft, ROWS, us)
        assert [*draft[:n], y] == plain[:n + 1]


def test_verification_reads_no_row_past_the_first_disagreement():
    class Lazy:
        read: list[int] = []

        def __len__(self):
            return 3

        def __getitem__(self, i):
            self.read.append(i)
            return ROWS[i]
    lazy = Lazy()
    assert coupled([2, 0], lazy, [0.3, 0.2, 0.9]) == (0, 1) and lazy.read == [0]


def test_a_coupled_draft_accepts_as_often_as_its_intervals_overlap():
    # p and a close q: the coupled draw agrees where icdf(p, u) == icdf(q, u), i.e. on the
    # overlap of the two tokens' CDF intervals (0.9 here), while rejection sampling would
    # accept sum(min(p, q)) = 0.9 too; a q that reorders mass loses more
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.4, 0.2])
    us = np.linspace(0.0, 1.0, 10001)[:-1]
    agree = np.mean([sample_at(p, u) == sample_at(q, u) for u in us])
    assert agree == pytest.approx(0.9, abs=1e-3)
    assert np.minimum(p, q).sum() == pytest.approx(0.9)


# --- the loop: drafting never changes a seeded text --------------------------------------------
def _params(seed, max_tokens=40):
    return GenerationParams(chat=False, max_tokens=max_tokens, sampling=SamplingParams(
        temperature=1.0, seed=seed, logit_bias=NO_EOG))


def _run(proposers, seed, k=3, control=None):
    model = FakeModel()
    eng = fake_engine(model, proposers(model), control=control or fixed(k))
    return eng.generate("a", _params(seed))


def _draft(model):
    # a different table model drafts: its q differs from the target's p everywhere
    return {"draft": DraftModelProposer(FakeModel(seed=99), n_ctx=256)}


@pytest.mark.parametrize("seed", [1, 7])
def test_a_draft_model_samples_exactly_the_plain_paths_tokens(seed):
    plain = _run(lambda m: {}, seed)
    assert len(plain.tokens) == 40
    for k in (1, 2, 4):
        fin = _run(_draft, seed, k=k)
        assert fin.tokens == plain.tokens, k
        assert fin.stats.drafted > 0
    # the fake draft shares the target's peaks, so coupling accepts a good share
    assert _run(_draft, seed, k=2).stats.accepted > 0


@pytest.mark.parametrize("seed", [3, 11])
def test_point_mass_drafts_of_any_length_sample_the_plain_paths_tokens(seed):
    plain = _run(lambda m: {}, seed)
    for k, script in ((1, MIXED), (4, MIXED), (2, [3]), (3, [None])):
        fin = _run(lambda m: {"scripted": ScriptedProposer(m, script)}, seed, k=k)
        assert fin.tokens == plain.tokens, (k, script)


def test_no_seed_still_differs_from_run_to_run():
    p = GenerationParams(chat=False, max_tokens=30,
                         sampling=SamplingParams(temperature=1.0, logit_bias=NO_EOG))
    eng = fake_engine(FakeModel(), {})
    assert eng.generate("a", p).tokens != eng.generate("a", p).tokens


def test_a_draft_equal_to_the_target_is_always_accepted_when_coupled():
    # q == p and the same uniform at the same position: the draws agree every time (a draft
    # reading another position's uniform would be accepted about as often as chance)
    fin = _run(lambda m: {"draft": DraftModelProposer(FakeModel(), n_ctx=256)}, 5, k=3)
    assert fin.tokens == _run(lambda m: {}, 5).tokens
    assert fin.stats.drafted > 20 and fin.stats.accepted == fin.stats.drafted
