"""Exported configurations use the target engines' documented option names and parse."""
from __future__ import annotations

import argparse
import json
import shlex

import pytest
from click.testing import CliRunner

from edgespec import registry
from edgespec.cli import cli
from edgespec.errors import InvalidInputError, UnsupportedError
from edgespec.lab.analysis.export import draft_tokens, export, pooled_acceptance

# The documented names, and where they come from (docs/identity.md cites the same):
VLLM_SPECULATIVE_CONFIG = {
    # vllm/config/speculative.py SpeculativeConfig (docs.vllm.ai v0.12.0 API reference:
    # SpeculativeMethod = "ngram" | "medusa" | "mlp_speculator" | "draft_model" | "suffix" | eagle)
    "method": {"ngram", "draft_model", "suffix"},
    "keys": {"method", "model", "num_speculative_tokens",
             # docs/features/spec_decode n-gram section
             "prompt_lookup_min", "prompt_lookup_max",
             # vllm/v1/spec_decode/suffix_decoding.py (v0.14.0) reads these config fields
             "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
             "suffix_decoding_min_token_prob"},
}
SGLANG_FLAGS = {
    # docs.sglang.io docs/advanced_features/speculative_decoding.md (Standalone, Ngram,
    # Full Parameter Reference)
    "--speculative-algorithm": {"EAGLE", "EAGLE3", "STANDALONE", "NGRAM"},
    "--speculative-draft-model-path": None, "--speculative-num-steps": int,
    "--speculative-eagle-topk": int, "--speculative-num-draft-tokens": int,
    "--speculative-ngram-min-match-window-size": int,
    "--speculative-ngram-max-match-window-size": int, "--model-path": None,
}
LLAMA_SERVER_FLAGS = {
    # llama.cpp common/arg.cpp as vendored by llama-cpp-python 0.3.36 (the build edgespec
    # runs; docs/speculative.md describes the same options)
    "-m": None, "--spec-draft-model": None, "--spec-draft-n-max": int,
    "--spec-type": {"none", "draft-simple", "ngram-cache", "ngram-simple", "ngram-map-k",
                    "ngram-map-k4v", "ngram-mod"},
    "--spec-ngram-simple-size-n": int, "--spec-ngram-simple-size-m": int,
}


def parser(table: dict) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    for name, kind in table.items():
        if isinstance(kind, set):
            ap.add_argument(name, choices=sorted(kind))
        else:
            ap.add_argument(name, type=kind or str)
    return ap


@pytest.fixture
def qualified(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    rec = {"acceptance_rate": 0.7, "n": 3, "speedup": 1.3, "speedup_ci_low": 1.1}
    for proposer in ("ngram", "suffix", "draft:qwen-0.5b"):
        registry.record_qualification("qwen-1.5b", proposer, {"coding": rec,
                                                               "chat": {**rec, "acceptance_rate": 0.5,
                                                                        "n": 1}})


def test_draft_length_follows_acceptance():
    assert [draft_tokens(a) for a in (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)] == [1, 1, 2, 3, 8, 8]
    assert pooled_acceptance({"a": {"acceptance_rate": 0.7, "n": 3},
                              "b": {"acceptance_rate": 0.5, "n": 1}}) == pytest.approx(0.65)


@pytest.mark.parametrize("proposer,method", [("ngram", "ngram"), ("suffix", "suffix"),
                                             ("draft:qwen-0.5b", "draft_model")])
def test_vllm_speculative_config(qualified, proposer, method):
    doc = export("vllm", "qwen-1.5b", proposer)
    cfg = doc["speculative_config"]
    assert cfg["method"] == method and cfg["method"] in VLLM_SPECULATIVE_CONFIG["method"]
    assert set(cfg) <= VLLM_SPECULATIVE_CONFIG["keys"]
    assert cfg["num_speculative_tokens"] == draft_tokens(0.65) == 3
    # the command line carries the same config as JSON
    argv = shlex.split(doc["command"])
    assert argv[:2] == ["vllm", "serve"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == cfg
    ro = doc["rests_on"]
    assert ro["target"]["sha256"] == registry.load_registry().get("qwen-1.5b").sha256
    assert set(ro["qualification"]) == {"coding", "chat"}
    assert ro["qualification"]["coding"]["target_sha256"] == ro["target"]["sha256"]
    if method == "draft_model":
        assert cfg["model"].endswith("qwen-0.5b.gguf") and ro["draft"]["sha256"]


@pytest.mark.parametrize("proposer", ["ngram", "draft:qwen-0.5b"])
def test_sglang_flags_parse_with_documented_names(qualified, proposer):
    doc = export("sglang", "qwen-1.5b", proposer)
    argv = shlex.split(doc["command"])
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    ns = parser(SGLANG_FLAGS).parse_args(argv[3:])
    assert ns.speculative_algorithm == ("NGRAM" if proposer == "ngram" else "STANDALONE")
    assert ns.speculative_num_draft_tokens >= 3


@pytest.mark.parametrize("proposer", ["ngram", "draft:qwen-0.5b"])
def test_llama_server_flags_parse_with_documented_names(qualified, proposer):
    doc = export("llama-server", "qwen-1.5b", proposer)
    argv = shlex.split(doc["command"])
    assert argv[0] == "llama-server"
    ns = parser(LLAMA_SERVER_FLAGS).parse_args(argv[1:])
    assert ns.spec_draft_n_max == 3
    assert (ns.spec_type == "ngram-simple") == (proposer == "ngram")


def test_the_default_pair_is_the_registry_default(qualified):
    doc = export("vllm")
    assert doc["rests_on"]["pair"] == {"target": "qwen-1.5b", "proposer": "draft:qwen-0.5b"}


def test_engines_without_a_method_refuse_it(qualified):
    for engine in ("sglang", "llama-server"):
        with pytest.raises(UnsupportedError, match="no suffix decoding"):
            export(engine, "qwen-1.5b", "suffix")


def test_an_unqualified_pair_needs_qualification_or_a_length(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    with pytest.raises(InvalidInputError, match="edgespec qualify"):
        export("vllm", "qwen-1.5b", "ngram")
    doc = export("vllm", "qwen-1.5b", "ngram", num_tokens=5)
    assert doc["speculative_config"]["num_speculative_tokens"] == 5
    assert doc["rests_on"]["num_speculative_tokens"]["from"] == "user"


def test_cli_writes_the_document(qualified, tmp_path):
    out = tmp_path / "spec.json"
    r = CliRunner().invoke(cli, ["export", "--to", "vllm", "qwen-1.5b:ngram", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["speculative_config"]["method"] == "ngram"
    r = CliRunner().invoke(cli, ["export", "--to", "sglang", "qwen-1.5b:suffix"])
    assert r.exit_code == 1 and "no suffix decoding" in r.output
