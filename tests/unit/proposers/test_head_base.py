"""What the proposers fed by the target's verify pass share (edgespec/proposers/head_base.py),
checked once on each kind with a fake head and fake target rows: one request at a time,
close releases both contexts, a repeated proposal decodes the last position again, and
sampling returns the distributions it drew from."""
from __future__ import annotations

import pytest

from edgespec.api.params import SamplingParams
from edgespec.proposers.eagle3 import Eagle3Proposer
from edgespec.proposers.mtp import MtpProposer
from fakes.heads import N_EMBD, N_FEAT, N_VOCAB, FakeHead, FakeTap, in_step

KINDS = [pytest.param(MtpProposer, N_EMBD, id="mtp"),
         pytest.param(Eagle3Proposer, N_FEAT, id="eagle3")]


@pytest.mark.parametrize("kind, width", KINDS)
def test_proposing_twice_without_accepting_decodes_the_last_position_again(kind, width):
    head = FakeHead()
    s = kind(head, FakeTap(width), target_vocab=N_VOCAB).open([1, 2, 3], SamplingParams())
    first = s.propose(2)
    assert s.propose(2).tokens == first.tokens and first.source == kind.name
    in_step(head, s)


@pytest.mark.parametrize("kind, width", KINDS)
def test_one_request_at_a_time_and_close_releases_both_contexts(kind, width):
    head, tap = FakeHead(), FakeTap(width)
    p = kind(head, tap, target_vocab=N_VOCAB)
    s = p.open([1, 2], SamplingParams())
    with pytest.raises(RuntimeError, match="serves one request at a time"):
        p.open([1, 2], SamplingParams())
    s.close(True)
    p.open([1, 2], SamplingParams())
    p.close()
    assert head.closed and tap.detached


@pytest.mark.parametrize("kind, width", KINDS)
def test_sampling_returns_the_distributions_it_drew_from(kind, width):
    s = kind(FakeHead(), FakeTap(width), target_vocab=N_VOCAB).open(
        [1, 2], SamplingParams(temperature=0.8, seed=3))
    d = s.propose(3)
    assert d.probs is not None and d.probs.shape == (3, N_VOCAB)
    assert all(d.probs[i, t] > 0 for i, t in enumerate(d.tokens))


@pytest.mark.parametrize("kind, width", KINDS)
def test_the_running_cost_estimate_is_smoothed(kind, width):
    p = kind(FakeHead(), FakeTap(width), target_vocab=N_VOCAB)
    p.note_cost(1.0)
    assert p.seconds_per_token == 1.0
    p.note_cost(2.0)
    assert p.seconds_per_token == pytest.approx(1.2)
