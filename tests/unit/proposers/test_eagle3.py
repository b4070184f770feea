"""The eagle3 proposer's bookkeeping, on a fake head and fake target features: the head's
cache holds, at every position P, the pair (seq[P+1], the target's g of P), whatever was
accepted or rejected; features the target never produced read as zeros; the refusals of a
target that publishes no layer inputs, of a draft for another target, and of a GGUF that
is no EAGLE-3 draft."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edgespec.api.params import SamplingParams
from edgespec.errors import InvalidInputError
from edgespec.proposers import REGISTRY, BuildContext
from edgespec.proposers.eagle3 import Eagle3Proposer, refusal
from edgespec.runtime.gguf_facts import ModelFacts
from edgespec.runtime.gguf_header import TensorInfo
from fakes.heads import N_FEAT, N_VOCAB, FakeHead, FakeTap, in_step


def _in_step(head: FakeHead, session) -> None:
    """In step (fakes.heads.in_step), and caught up: 0..len(seq)-2, each (seq[P+1], g_P)."""
    assert session.kv_len == len(session.seq) - 1
    in_step(head, session)


def test_the_first_draft_comes_from_the_last_accepted_token_and_no_draft_stays():
    head, tap = FakeHead(), FakeTap(N_FEAT)
    s = Eagle3Proposer(head, tap, target_vocab=N_VOCAB, max_draft=3).open([1, 2, 3],
                                                                          SamplingParams())
    d = s.propose(3)
    assert d.tokens == (4, 5, 6) and d.source == "eagle3" and len(d.confidence) == 3
    _in_step(head, s)
    assert tap.forgotten == 1  # the row of the last position is kept for a re-decode


@pytest.mark.parametrize("n_acc", [0, 1, 2, 3])
def test_the_cache_stays_in_step_whatever_is_accepted(n_acc):
    head, tap = FakeHead(), FakeTap(N_FEAT)
    s = Eagle3Proposer(head, tap, target_vocab=N_VOCAB).open([1, 2, 3], SamplingParams())
    for _ in range(4):
        d = s.propose(3)
        _in_step(head, s)
        s.accept([*d.tokens[:n_acc], 9], n_acc)  # the target's own token last
    s.propose(2)
    _in_step(head, s)


def test_a_single_token_sequence_gives_no_draft():
    head, tap = FakeHead(), FakeTap(N_FEAT)
    s = Eagle3Proposer(head, tap, target_vocab=N_VOCAB).open([1], SamplingParams())
    assert not s.propose(3).tokens and not head.kv


def test_features_the_target_never_produced_read_as_zeros_and_are_counted():
    head, tap = FakeHead(), FakeTap(N_FEAT, missing={0, 1})
    p = Eagle3Proposer(head, tap, target_vocab=N_VOCAB)
    s = p.open([1, 2, 3, 4], SamplingParams())
    s.propose(1)
    assert p.missing_rows == 2
    assert [head.kv[i][1] for i in range(3)] == [0.0, 0.0, 2.0]


def test_the_registry_knows_eagle3_as_an_opt_in_draft_model_proposer():
    spec = REGISTRY["eagle3"]
    assert spec.costly and spec.opt_in and spec.asked_only and spec.needs == ("draft_model",)
    assert spec.same_vocab and spec.check_options({"max_draft": "4"}) == {"max_draft": 4}
    with pytest.raises(InvalidInputError, match="needs a draft model"):
        spec.build(BuildContext())


def test_auto_never_weighs_eagle3():
    from edgespec.planner.search import _kinds  # noqa: PLC2701 (the planner's list)
    names = [n for n, _ in _kinds("auto", has_draft=True)]
    assert "eagle3" not in names and "draft" in names


def _facts(arch, n_layers=30, n_embd=576, n_vocab=49152, tensors=(), meta=None) -> ModelFacts:
    return ModelFacts(path=f"/m/{arch}.gguf", file_bytes=1, arch=arch, name="", n_layers=n_layers,
                      n_embd=n_embd, n_ff=1, n_head=1, n_head_kv_per_layer=(1,) * n_layers,
                      head_dim_k=64, head_dim_v=64, n_ctx_train=1, n_vocab=n_vocab, n_merges=0,
                      sliding_window=0, swa_layers=(False,) * n_layers, weight_bytes=1,
                      bytes_by_type={}, layer_bytes=(0,) * n_layers, token_embd_bytes=0,
                      output_bytes=0, other_bytes=0, n_tensors=len(tensors),
                      metadata=meta or {}, tensors=tuple(tensors))


TARGET = _facts("llama")
DRAFT = _facts("eagle3", n_layers=1, meta={"eagle3.target_hidden_size": 576},
               tensors=[TensorInfo("fc.weight", (1728, 576), 0, 0, 1)])


def test_a_matching_draft_passes():
    assert refusal(TARGET, DRAFT, (0, 15, 29)) is None
    assert refusal(TARGET, DRAFT, (0, 15, 29), d2t=np.array([0, 5, 49151])) is None


@pytest.mark.parametrize("target, draft, layers, d2t, words", [
    (_facts("qwen2", n_layers=24), DRAFT, (0, 12, 20), None,
     "qwen2.gguf is a qwen2 model: llama.cpp publishes the layer inputs"),
    (TARGET, _facts("llama"), (0, 15, 29), None, "llama.gguf is a llama model, not an EAGLE-3"),
    (TARGET, DRAFT, (0, 15), None, "names 2 target layers"),
    (TARGET, DRAFT, (0, 15, 30), None, "reads target layer 30, but llama.gguf has layers 0..29"),
    (TARGET, DRAFT, (-1, 15, 29), None, "reads target layer -1"),
    (TARGET, replace(DRAFT, metadata={"eagle3.target_hidden_size": 896}), (0, 15, 29), None,
     "target of hidden size 896"),
    (TARGET, replace(DRAFT, n_embd=512), (0, 15, 29), None,
     "embedding length (512) must equal llama.gguf's (576)"),
    (TARGET, DRAFT, (0, 15, 29), np.array([0, 49152]), "outside llama.gguf's 49152 tokens"),
])
def test_a_draft_for_another_target_is_refused_with_what_is_wrong(target, draft, layers, d2t,
                                                                  words):
    why = refusal(target, draft, layers, d2t)
    assert why is not None and words in why


def test_the_final_state_serves_layer_n_only_where_the_target_publishes_it():
    assert "layers 0..29" in refusal(TARGET, DRAFT, (0, 15, 30))
    assert refusal(_facts("qwen35"), DRAFT, (0, 15, 30)) is None
