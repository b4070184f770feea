"""Qualification of your own models, end to end on real small models: `edgespec qualify` of
models added with `edgespec models add` records by digest; `export`, the planner's
acceptance (what `--proposer auto` weighs) and `models list` find the records again under
any name or path for the same file, and leave them out, flagged stale, once a name points
at another file. Runs in a throwaway EDGESPEC_HOME with a few tokens per prompt."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from edgespec.cli import cli

THREADS = os.environ.get("EDGESPEC_TEST_THREADS", "2")


def _cli(*args):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r


@pytest.fixture
def home(model_path, tmp_path, monkeypatch):
    smol, qwen = model_path("smollm2-135m"), model_path("qwen-0.5b")
    home = tmp_path / "home"
    home.mkdir()
    calibration = smol.parent.parent / "calibration"  # cached speeds: nothing re-measured
    if calibration.is_dir():
        shutil.copytree(calibration, home / "calibration")
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    return home, smol, qwen


def _qualify(target, proposer, out):
    r = _cli("qualify", target, proposer, "--slices", "qa", "--per-slice", "1",
             "--max-tokens", "8", "--threads", THREADS, "--ctx", "512", "--out", out)
    assert r.exit_code == 0, r.output
    return r


def test_user_models_qualify_export_and_auto_by_digest(home, tmp_path):
    from edgespec import registry
    from edgespec.planner import acceptance_for, registered_draft

    home, smol, qwen = home
    for name, role in (("my-smol", "target"), ("my-draft", "draft")):
        r = _cli("models", "add", name, smol, "--role", role)
        assert r.exit_code == 0, r.output
    sha = registry.load_registry().get("my-smol").sha256
    assert registry.qualification("my-smol", "ngram") == {}

    # a model-free proposer and a draft of your own, neither registered as a pair
    _qualify("my-smol", "ngram", tmp_path / "ev1")
    r = _qualify("my-smol", "draft:my-draft", tmp_path / "ev2")
    assert "registered the pair my-smol + draft:my-draft" in r.output
    got = registry.qualification("my-smol", "ngram")
    assert set(got) == {"qa"} and got["qa"]["target_sha256"] == sha
    assert got["qa"]["target"] == "my-smol" and got["qa"]["n"] == 1
    doc = json.loads((home / "qualification.json").read_text())
    assert set(doc["by_digest"]) == {sha} and set(doc["by_digest"][sha]) == {
        "ngram", f"draft:{sha}"}

    # found by digest: the same file under another name, or by its path
    r = _cli("models", "add", "same-file", smol)
    assert r.exit_code == 0, r.output
    assert registry.qualification("same-file", "ngram")["qa"]["n"] == 1
    assert registry.qualification(str(smol), "draft:my-draft")["qa"]["draft_sha256"] == sha

    # --proposer auto: the registered draft is weighed, with what was measured (eight
    # tokens may draft nothing, leaving acceptance None and the planner its defaults, so
    # these records carry one), found by digest for a name or a path alike
    assert registered_draft("my-smol") == "my-draft"
    registry.record_qualification("my-smol", "draft:my-draft",
                                  {"coding": {"acceptance": 0.8, "acceptance_rate": 0.8,
                                              "coverage": 1.0, "n": 1}})
    registry.record_qualification(str(smol), "ngram",
                                  {"coding": {"acceptance": 0.6, "coverage": 0.5}})
    assert acceptance_for("draft", "my-smol", "my-draft").alpha == 0.8
    assert acceptance_for("ngram", "same-file").alpha == 0.6
    assert acceptance_for("ngram", str(smol)).source == "qualification (1 slices)"

    # export from the records, and `models list` shows the qualified pair
    r = _cli("export", "--to", "llama-server", "my-smol:draft:my-draft")
    assert r.exit_code == 0, r.output
    rests = json.loads(r.output)["rests_on"]
    assert rests["target"]["sha256"] == sha and rests["draft"]["gguf"] == str(smol)
    assert set(rests["qualification"]) == {"qa", "coding"}
    r = _cli("models", "list")
    assert any(line.startswith("my-smol") and "draft:my-draft" in line and "qualified: coding, qa"
               in line for line in r.output.splitlines()), r.output

    # my-smol now names another file: its records are left out and flagged stale
    assert _cli("models", "remove", "my-smol").exit_code == 0
    assert _cli("models", "add", "my-smol", qwen).exit_code == 0
    assert registry.qualification("my-smol", "ngram") == {}
    assert set(registry.stale_qualification("my-smol", "ngram")) == {"qa"}
    assert acceptance_for("ngram", "my-smol").source == "default"
    r = _cli("export", "--to", "llama-server", "my-smol:ngram")
    assert r.exit_code != 0 and "measured on other files" in r.output, r.output
    # the file itself still has them, under the name that still points at it
    assert registry.qualification("same-file", "ngram")["qa"]["n"] == 1


def test_a_bridge_pair_of_your_own_models_is_pinned_in_your_registry(home):
    """smollm2-135m drafts for gemma-270m through the bridge,
    a pair the shipped registry does not pin: refused, pinned with `models pin-bridge`
    into the user registry (by vocabulary digests), then run."""
    from edgespec import registry

    home, smol, _ = home
    gemma = smol.with_name("gemma-270m.gguf")
    assert _cli("models", "add", "my-gemma", gemma).exit_code == 0
    assert _cli("models", "add", "my-smol", smol, "--role", "draft").exit_code == 0
    gen = ["generate", "--target", "my-gemma", "--draft", "my-smol", "--proposer", "bridge",
           "--threads", THREADS, "--ctx", "256", "--no-adaptive", "--raw", "--max-tokens", "4",
           "--json", "The colours of the rainbow are"]
    r = _cli(*gen)
    assert r.exit_code != 0 and "edgespec models pin-bridge my-gemma my-smol" in r.output, \
        r.output
    r = _cli("models", "pin-bridge", "my-gemma", "my-smol")
    assert r.exit_code == 0 and "pinned in" in r.output, r.output
    pair = registry.load_registry().pair("my-gemma", "bridge:my-smol")
    assert registry.load_registry().origin("my-gemma") == "user" and pair.target_vocab_sha256
    assert "already pinned" in _cli("models", "pin-bridge", "my-gemma", "my-smol").output
    r = _cli(*gen)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["stats"]["generated_tokens"] >= 1


def test_a_scanned_model_and_its_path_share_records_by_digest(home, tmp_path, monkeypatch):
    """An ollama model (a store reference) is qualified like any other: its record is found
    again by the path of the same bytes, and by a registry name pinning them."""
    from edgespec import registry
    from edgespec.registry.scan.locations import OLLAMA_MODEL_LAYER

    home, smol, _ = home
    sha = registry.load_registry().get("smollm2-135m").sha256
    store = tmp_path / "ollama"
    (store / "blobs").mkdir(parents=True)
    (store / "blobs" / f"sha256-{sha}").symlink_to(smol)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "smol" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": OLLAMA_MODEL_LAYER,
                                                "digest": f"sha256:{sha}",
                                                "size": smol.stat().st_size}]}))
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    registry.record_qualification("ollama:smol", "ngram", {"qa": {"acceptance": 0.5}})
    assert registry.qualification(str(smol), "ngram")["qa"]["target"] == "ollama:smol"
    assert registry.qualification("smollm2-135m", "ngram")["qa"]["target_sha256"] == sha
