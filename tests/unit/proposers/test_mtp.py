"""The mtp proposer's bookkeeping, on a fake head and fake target rows: the head's cache
holds, at every position, only entries made from the target's hidden states, whatever was
accepted or rejected; rows the target never produced read as zeros; the refusal of a target
without NextN layers."""
from __future__ import annotations

import pytest

from edgespec.api.params import SamplingParams
from edgespec.errors import InvalidInputError
from edgespec.proposers import REGISTRY, BuildContext
from edgespec.proposers.mtp import MtpProposer, refusal
from fakes.heads import N_EMBD, N_VOCAB, FakeHead, FakeTap, in_step


def test_drafts_chain_the_heads_own_state_and_leave_no_draft_position_behind():
    head, tap = FakeHead(), FakeTap(N_EMBD)
    s = MtpProposer(head, tap, target_vocab=N_VOCAB, max_draft=3).open([1, 2, 3], SamplingParams())
    d = s.propose(3)
    assert d.tokens == (4, 5, 6) and d.source == "mtp" and len(d.confidence) == 3
    assert s.kv_len == 3
    in_step(head, s)


@pytest.mark.parametrize("n_acc", [0, 1, 2, 3])
def test_the_cache_stays_in_step_whatever_is_accepted(n_acc):
    head, tap = FakeHead(), FakeTap(N_EMBD)
    s = MtpProposer(head, tap, target_vocab=N_VOCAB).open([1, 2, 3], SamplingParams())
    for _ in range(4):
        d = s.propose(3)
        s.accept([*d.tokens[:n_acc], 9], n_acc)  # the target's own token last
        in_step(head, s) if s.kv_len == len(s.seq) else None
        d = s.propose(3)  # catches up on the accepted positions with the target's rows
        assert s.kv_len == len(s.seq)
        in_step(head, s)
        s.accept([d.tokens[0]] if n_acc else [7], int(bool(n_acc)))


def test_rows_the_target_never_produced_read_as_zeros_and_are_counted():
    head, tap = FakeHead(), FakeTap(N_EMBD, missing={0, 1})
    p = MtpProposer(head, tap, target_vocab=N_VOCAB)
    s = p.open([1, 2, 3, 4], SamplingParams())
    s.propose(1)
    assert p.missing_rows == 2
    assert [head.kv[i][1] for i in range(4)] == [0.0, 0.0, 0.0, 2.0]


def test_the_registry_knows_mtp_as_a_proposer_built_only_when_asked():
    spec = REGISTRY["mtp"]
    assert spec.costly and spec.own_model and spec.check_options({"max_draft": "4"}) == {"max_draft": 4}
    with pytest.raises(InvalidInputError, match="through the engine"):
        spec.build(BuildContext())


def test_a_target_without_nextn_layers_is_refused_with_what_to_do(model_path):
    why = refusal(model_path("qwen-0.5b"), loaded_with_mtp=True)
    assert "qwen-0.5b.gguf has no multi-token-prediction layers" in why
    assert "qwen2.nextn_predict_layers" in why and "--proposer self" in why
