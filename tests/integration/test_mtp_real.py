"""The mtp proposer on a tiny GGUF with a real NextN (MTP) layer (tests/integration/mtp_model.py).

No MTP-capable model can be installed here, so these tests build one: llama.cpp runs its
real ``mimo2`` MTP graph on it, but its weights are seeded noise shaped to agree with the
target about half the time. They prove the plumbing (the head's KV in step with the target
on accept and reject, lossless output, the refusal of a target without MTP layers), not
the speed.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgespec.lab.analysis import parity as P
from edgespec.engine.engine import Engine
from edgespec.errors import InvalidInputError
from edgespec.runtime.gguf_facts import read_facts

sys.path.insert(0, str(Path(__file__).parent))
from head_checks import (PROMPTS, assert_fresh_catch_up_drafts_alike,  # noqa: E402
                         session_after_rejections)
from mtp_model import N_NEXTN, N_TRUNK, write_mtp_model  # noqa: E402


@pytest.fixture(scope="session")
def mtp_gguf(model_path, tmp_path_factory):
    """The tiny MTP model, built once per session (tokenizer: smollm2-135m's)."""
    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf",
                           model_path("smollm2-135m"))


@pytest.fixture(scope="module")
def engine(mtp_gguf):
    eng = Engine.load(str(mtp_gguf), proposer="mtp", adaptive=False, max_draft=3,
                      n_ctx=512, threads=2, pull=False)
    yield eng
    eng.close()


def test_the_header_counts_the_nextn_layers(mtp_gguf, model_path):
    facts = read_facts(mtp_gguf)
    assert facts.nextn_predict_layers == N_NEXTN and facts.n_layers == N_TRUNK + N_NEXTN
    assert facts.mtp_bytes == facts.layer_bytes[-1] > 0
    assert read_facts(model_path("qwen-0.5b")).nextn_predict_layers == 0


def test_llama_cpp_loads_the_head(engine):
    from edgespec.runtime.mtp import n_layer_nextn
    assert engine.target.load_mtp and n_layer_nextn(engine.target) == N_NEXTN
    assert engine.target.n_layer == N_TRUNK


def test_mtp_greedy_output_equals_the_plain_path(engine):
    """Plumbing, not speed: the drafts come from a noise head; verification keeps the
    output the target's own, token for token."""
    outs = list(P.greedy_parity(engine, PROMPTS, ["mtp"], max_tokens=48, tolerance=0.0))
    for o in outs:
        assert o.identical, o
    assert sum(o.drafted for o in outs) > 0
    # the head agrees with the target about half the time: both accepts and rejects ran
    assert 0 < sum(o.accepted for o in outs) < sum(o.drafted for o in outs)
    assert engine.proposers["mtp"].missing_rows == 0


def test_the_heads_cache_is_in_step_after_rejections(engine, monkeypatch):
    """After a generation with rejected drafts, the MTP cache holds exactly the accepted
    positions, and what it holds equals a from-scratch decode of the accepted sequence
    with the target's hidden states: the next draft is the same either way."""
    prop = engine.proposers["mtp"]
    s = session_after_rejections(engine, "mtp", monkeypatch)
    assert prop.head.seq_pos_max() == s.kv_len - 1 and s.kv_len <= len(s.seq)
    kept = s.propose(3)
    assert prop.head.seq_pos_max() == len(s.seq) - 1
    assert_fresh_catch_up_drafts_alike(engine, "mtp", s, kept)


def test_a_target_without_mtp_layers_is_refused_with_what_to_do(model_path):
    with pytest.raises(InvalidInputError, match=r"qwen-0\.5b\.gguf has no multi-token-"
                                                r"prediction layers \(qwen2\.nextn_predict"):
        Engine.load(str(model_path("qwen-0.5b")), proposer="mtp", adaptive=False,
                    n_ctx=256, threads=2, pull=False)


def test_plan_with_mtp_shows_the_heads_memory(mtp_gguf):
    from click.testing import CliRunner
    from edgespec.cli import cli
    r = CliRunner().invoke(cli, ["plan", "--target", str(mtp_gguf), "--proposer", "mtp"])
    assert r.exit_code == 0, r.output
    assert "proposer   mtp" in r.output
    assert "mtp head weights" in r.output and "mtp KV cache" in r.output
    assert "MTP head" in r.output  # its cost per draft token, and where it came from


def test_calibration_measures_the_heads_cost_per_draft_token(mtp_gguf, tmp_path):
    from edgespec.calibration import cache
    cal = cache.load_or_measure(mtp_gguf, n_threads=2, home=tmp_path, repeats=1)
    assert cal.mtp_step_seconds is not None and 0 < cal.mtp_step_seconds < 1
    assert cache.load_cached(cal.key, tmp_path).mtp_step_seconds == cal.mtp_step_seconds


def test_auto_on_a_nextn_target_weighs_mtp_and_records_its_choice(mtp_gguf):
    eng = Engine.load(str(mtp_gguf), proposer="auto", adaptive=False, n_ctx=512, threads=2,
                      pull=False)
    try:
        cands = {c.proposer: c for c in eng.plan.candidates}
        assert "mtp" in cands and cands["mtp"].acceptance is not None
        picked = "mtp" in eng.config.proposer.split("+")
        assert picked == (eng.plan.proposer == "mtp")
        assert any(r.startswith(("chosen mtp", "not mtp")) for r in eng.plan.reasons)
        if eng.config.proposer != "none":
            outs = list(P.greedy_parity(eng, PROMPTS[:1], [eng.config.proposer], max_tokens=24,
                                        tolerance=0.0))
            assert all(o.identical for o in outs), outs
    finally:
        eng.close()


def test_parity_cli_runs_asked_only_proposers(mtp_gguf, tmp_path):
    import json
    from click.testing import CliRunner
    from edgespec.cli import cli
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[1].prompt, "category": "test"}) + "\n")
    r = CliRunner().invoke(cli, ["parity", "--target", str(mtp_gguf), "--proposers",
                                 "mtp,lookahead", "--prompts", str(prompts), "--max-tokens", "16",
                                 "--ctx", "512", "--threads", "2", "--max-draft", "3",
                                 "--no-exact", "--tolerance", "0"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split() for line in r.output.splitlines()
            if line.startswith(("mtp ", "lookahead "))}
    assert set(rows) == {"mtp", "lookahead"} and rows["mtp"][1] == "1" and rows["mtp"][4] == "0"
