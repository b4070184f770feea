"""The mtp proposer's bookkeeping, on a fake head and fake target rows: the head's cache
holds, at every position, only entries made from the target's hidden states, whatever was
accepted or rejected; rows the target never produced read as zeros; the refusal of a target
without NextN layers."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.api.params import SamplingParams
from edgespec.errors import InvalidInputError
from edgespec.proposers import REGISTRY, BuildContext
from edgespec.proposers.mtp import MtpProposer, refusal

N_EMBD, N_VOCAB = 4, 16


class FakeHead:
    """An MTP context: its cache maps a position to (token, the hidden row's tag)."""

    def __init__(self) -> None:
        self.n_ctx, self.n_embd = 256, N_EMBD
        self.kv: dict[int, tuple[int, float]] = {}
        self.closed = False

    def decode(self, tokens, pos0, hidden, want=True):
        for i, tok in enumerate(tokens):
            assert pos0 + i not in self.kv, f"position {pos0 + i} decoded twice"
            self.kv[pos0 + i] = (int(tok), float(hidden[i][0]))
        assert sorted(self.kv) == list(range(len(self.kv))), "a hole in the cache"
        logits = np.zeros(N_VOCAB, np.float32)
        logits[(tokens[-1] + 1) % N_VOCAB] = 5.0  # drafts "the next id"
        return (logits, np.full(N_EMBD, -1.0, np.float32)) if want else None

    def trim(self, from_pos):
        self.kv = {p: v for p, v in self.kv.items() if p < from_pos}

    def clear(self):
        self.kv = {}

    def close(self):
        self.closed = True


class FakeTap:
    """The target's rows: row p is tagged p (after position p), as the verify pass gives."""

    def __init__(self, missing=()) -> None:
        self.missing = set(missing)
        self.detached = False
        self.forgotten = -1

    def row(self, seq, pos):
        assert seq == 0 and pos >= self.forgotten
        return None if pos in self.missing else np.full(N_EMBD, float(pos), np.float32)

    def forget_below(self, seq, pos):
        self.forgotten = max(self.forgotten, pos)

    def detach(self):
        self.detached = True


def _in_step(head: FakeHead, session) -> None:
    """The cache holds positions 0..kv_len-1, each with the token and the target's row of
    the position before (position 0: zeros)."""
    assert sorted(head.kv) == list(range(session.kv_len))
    for p, (tok, tag) in head.kv.items():
        assert tok == session.seq[p] and tag == (p - 1 if p else 0.0)


def test_drafts_chain_the_heads_own_state_and_leave_no_draft_position_behind():
    head, tap = FakeHead(), FakeTap()
    s = MtpProposer(head, tap, target_vocab=N_VOCAB, max_draft=3).open([1, 2, 3], SamplingParams())
    d = s.propose(3)
    assert d.tokens == (4, 5, 6) and d.source == "mtp" and len(d.confidence) == 3
    assert s.kv_len == 3
    _in_step(head, s)


@pytest.mark.parametrize("n_acc", [0, 1, 2, 3])
def test_the_cache_stays_in_step_whatever_is_accepted(n_acc):
    head, tap = FakeHead(), FakeTap()
    s = MtpProposer(head, tap, target_vocab=N_VOCAB).open([1, 2, 3], SamplingParams())
    for _ in range(4):
        d = s.propose(3)
        s.accept([*d.tokens[:n_acc], 9], n_acc)  # the target's own token last
        _in_step(head, s) if s.kv_len == len(s.seq) else None
        d = s.propose(3)  # catches up on the accepted positions with the target's rows
        assert s.kv_len == len(s.seq)
        _in_step(head, s)
        s.accept([d.tokens[0]] if n_acc else [7], int(bool(n_acc)))


def test_proposing_twice_without_accepting_decodes_the_last_position_again():
    head, tap = FakeHead(), FakeTap()
    s = MtpProposer(head, tap, target_vocab=N_VOCAB).open([1, 2, 3], SamplingParams())
    assert s.propose(2).tokens == s.propose(2).tokens
    _in_step(head, s)


def test_rows_the_target_never_produced_read_as_zeros_and_are_counted():
    head, tap = FakeHead(), FakeTap(missing={0, 1})
    p = MtpProposer(head, tap, target_vocab=N_VOCAB)
    s = p.open([1, 2, 3, 4], SamplingParams())
    s.propose(1)
    assert p.missing_rows == 2
    assert [head.kv[i][1] for i in range(4)] == [0.0, 0.0, 0.0, 2.0]


def test_one_request_at_a_time_and_close_releases_both_contexts():
    head, tap = FakeHead(), FakeTap()
    p = MtpProposer(head, tap, target_vocab=N_VOCAB)
    s = p.open([1], SamplingParams())
    with pytest.raises(RuntimeError):
        p.open([1], SamplingParams())
    s.close(True)
    p.open([1], SamplingParams())
    p.close()
    assert head.closed and tap.detached


def test_sampling_returns_the_distributions_it_drew_from():
    head, tap = FakeHead(), FakeTap()
    s = MtpProposer(head, tap, target_vocab=N_VOCAB).open(
        [1, 2], SamplingParams(temperature=0.8, seed=3))
    d = s.propose(3)
    assert d.probs is not None and d.probs.shape == (3, N_VOCAB)
    assert all(d.probs[i, t] > 0 for i, t in enumerate(d.tokens))


def test_the_registry_knows_mtp_as_a_proposer_built_only_when_asked():
    spec = REGISTRY["mtp"]
    assert spec.costly and spec.own_model and spec.check_options({"max_draft": "4"}) == {"max_draft": 4}
    with pytest.raises(InvalidInputError, match="through the engine"):
        spec.build(BuildContext())


def test_a_target_without_nextn_layers_is_refused_with_what_to_do(model_path):
    why = refusal(model_path("qwen-0.5b"), loaded_with_mtp=True)
    assert "qwen-0.5b.gguf has no multi-token-prediction layers" in why
    assert "qwen2.nextn_predict_layers" in why and "--proposer self" in why
