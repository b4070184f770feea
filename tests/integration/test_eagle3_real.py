"""The eagle3 proposer on smollm2-135m with a tiny EAGLE-3 draft built for it
(tests/integration/eagle3_model.py).

No EAGLE-3 GGUF can be obtained here, so these tests build one: llama.cpp runs its real
``eagle3`` encoder and decoder graphs on it, fed by the target's layer inputs from the
verify pass, but its weights are chosen (an induction head), not trained. They prove the
plumbing (features in order, the head's KV in step on accept and reject, lossless output,
sampling parity, the refusals before llama.cpp could abort), not the speed.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.lab.analysis import parity as P
from edgespec.api.params import SamplingParams
from edgespec.cli import cli
from edgespec.engine.engine import Engine
from edgespec.errors import EdgespecError, InvalidInputError

sys.path.insert(0, str(Path(__file__).parent))
from eagle3_model import write_eagle3_model, write_plain_gguf  # noqa: E402
from head_checks import (PROMPTS, assert_fresh_catch_up_drafts_alike,  # noqa: E402
                         session_after_rejections)


@pytest.fixture(scope="session")
def eagle3_gguf(model_path, tmp_path_factory):
    """The tiny EAGLE-3 draft for smollm2-135m, built once per session."""
    return write_eagle3_model(tmp_path_factory.mktemp("eagle3") / "tiny-eagle3.gguf",
                              model_path("smollm2-135m"))


@pytest.fixture(scope="module")
def engine(model_path, eagle3_gguf):
    eng = Engine.load(str(model_path("smollm2-135m")), str(eagle3_gguf), proposer="eagle3",
                      adaptive=False, max_draft=3, n_ctx=512, threads=2, pull=False)
    yield eng
    eng.close()


def _load(model_path, draft, target="smollm2-135m", proposer="eagle3"):
    return Engine.load(str(model_path(target)), str(draft), proposer=proposer, adaptive=False,
                       n_ctx=256, threads=2, pull=False)


def test_the_engine_builds_eagle3_only_when_asked(engine):
    from edgespec.runtime.eagle3 import target_layer_ids
    assert "eagle3" in engine.proposers and "draft" not in engine.proposers
    assert target_layer_ids(engine.proposers["eagle3"].head.model) == (0, 15, 29)


def test_eagle3_greedy_output_equals_the_plain_path(engine):
    """Plumbing, not speed: verification keeps the output the target's own, token for
    token, while the head's drafts are both accepted and rejected."""
    outs = list(P.greedy_parity(engine, PROMPTS, ["eagle3"], max_tokens=48, tolerance=0.0))
    for o in outs:
        assert o.identical, o
    assert 0 < sum(o.accepted for o in outs) < sum(o.drafted for o in outs)
    assert engine.proposers["eagle3"].missing_rows == 0


def test_the_heads_cache_is_in_step_after_rejections(engine, monkeypatch):
    """After a generation with rejected drafts the head's cache holds exactly the
    positions made from the target's features, and equals a from-scratch catch-up."""
    prop = engine.proposers["eagle3"]
    s = session_after_rejections(engine, "eagle3", monkeypatch)
    assert prop.head.seq_pos_max() == s.kv_len - 1 and s.kv_len <= len(s.seq) - 1
    kept = s.propose(3)
    assert prop.head.seq_pos_max() == len(s.seq) - 2 == s.kv_len - 1
    assert_fresh_catch_up_drafts_alike(engine, "eagle3", s, kept)


def test_eagle3_passes_sampling_parity(engine):
    report = P.ConfigReport("eagle3", alpha=1e-3)
    report.sampling.extend(P.sampling_parity(engine, PROMPTS[1:2], ["eagle3"],
                                             SamplingParams(temperature=0.8), n_seeds=30,
                                             positions=3, chat=False))
    assert report.sampling_ok, report.to_json()


def test_generate_runs_eagle3_from_the_cli(model_path, eagle3_gguf):
    r = CliRunner().invoke(cli, ["generate", "--target", str(model_path("smollm2-135m")),
                                 "--proposer", "eagle3", "--draft", str(eagle3_gguf),
                                 "--no-adaptive", "--max-draft", "3", "--max-tokens", "12",
                                 "--stats", "Repeat: one two three, one two three,"])
    assert r.exit_code == 0, r.output
    assert "proposer eagle3" in r.output


def test_a_qwen2_target_asked_for_eagle3_gets_an_error_not_an_abort(model_path, tmp_path):
    """qwen2 graphs publish no layer inputs (llama.cpp would abort): refused first. The
    draft carries qwen's tokenizer, so the vocabulary check passes and this one speaks."""
    draft = write_eagle3_model(tmp_path / "qwen-e3.gguf", model_path("smollm2-135m"),
                               tokenizer_from=model_path("qwen-0.5b"), own_output=False,
                               target_hidden=896, layers=(0, 12, 20))
    with pytest.raises(InvalidInputError, match=r"qwen2 model.*cannot run on it"):
        _load(model_path, draft, target="qwen-0.5b")


def test_a_draft_for_another_hidden_size_is_refused(model_path, tmp_path):
    draft = write_eagle3_model(tmp_path / "e3-896.gguf", model_path("smollm2-135m"),
                               target_hidden=896)
    with pytest.raises(InvalidInputError, match=r"target of hidden size 896 .* has 576"):
        _load(model_path, draft)


def test_a_draft_for_another_vocabulary_is_refused(model_path, tmp_path):
    draft = write_eagle3_model(tmp_path / "e3-qwen-vocab.gguf", model_path("smollm2-135m"),
                               tokenizer_from=model_path("qwen-0.5b"), own_output=False)
    with pytest.raises(EdgespecError, match=r"cannot draft for target smollm2-135m\.gguf"):
        _load(model_path, draft)


def test_a_d2t_map_past_the_target_vocabulary_is_refused(model_path, tmp_path):
    draft = write_eagle3_model(tmp_path / "e3-d2t.gguf", model_path("smollm2-135m"),
                               d2t=np.arange(1000, dtype=np.int64) * 60)
    with pytest.raises(InvalidInputError, match=r"maps its vocabulary \(d2t\) to ids up to "
                                                r"59940, outside smollm2-135m\.gguf's 49152"):
        _load(model_path, draft)


def test_a_layer_id_past_the_target_is_refused(model_path, tmp_path):
    draft = write_eagle3_model(tmp_path / "e3-layer.gguf", model_path("smollm2-135m"),
                               layers=(0, 15, 30))
    with pytest.raises(InvalidInputError, match=r"reads target layer 30, but smollm2-135m"
                                                r"\.gguf has layers 0\.\.29"):
        _load(model_path, draft)


def test_a_non_eagle3_gguf_as_the_draft_is_refused(model_path, tmp_path):
    plain = write_plain_gguf(tmp_path / "plain.gguf", model_path("smollm2-135m"))
    with pytest.raises(InvalidInputError, match=r"plain\.gguf is a llama model, not an "
                                                r"EAGLE-3 draft"):
        _load(model_path, plain)


def test_an_eagle3_draft_asked_for_as_an_ordinary_draft_is_refused(model_path, eagle3_gguf):
    with pytest.raises(InvalidInputError, match=r"is an EAGLE-3 head, not a model the draft "
                                                r"proposer can run; use --proposer eagle3"):
        _load(model_path, eagle3_gguf, proposer="draft")
