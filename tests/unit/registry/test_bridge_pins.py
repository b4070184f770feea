"""Cross-tokenizer pairs in models.toml: parsed with their pins, refused when a pin differs."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from edgespec import registry
from edgespec.proposers.vocab_bridge import BRIDGE_VERSION
from edgespec.errors import InvalidInputError, ModelError
from edgespec.registry import bridge_pins

REPO_TOML = Path(__file__).resolve().parents[3] / "edgespec" / "registry" / "models.toml"
TV, DV = "a" * 64, "b" * 64


def _doc() -> dict:
    model = {"size": 100, "sha256": "0" * 64, "chat_template": True, "context": 4096,
             "source": {"kind": "whole-file", "packages": ["pkg==1.0"], "file": "pkg/m.gguf"}}
    return {"schema": 1,
            "models": {"t": {**model, "role": "target", "tokenizer": "tok-1"},
                       "d": {**model, "role": "draft", "tokenizer": "tok-2"},
                       "s": {**model, "role": "draft", "tokenizer": "tok-1"}},
            "pairs": [{"target": "t", "proposer": "bridge", "draft": "d", "bridge_version": "1",
                       "target_vocab_sha256": TV, "draft_vocab_sha256": DV}]}


def _load(doc) -> registry.Registry:
    return registry.Registry.from_dict(doc, Path("models.toml"))


def test_a_bridge_pair_is_parsed_with_its_pins():
    p = _load(_doc()).pair("t", "bridge:d")
    assert (p.proposer, p.draft, p.key) == ("bridge", "d", "bridge:d")
    assert (p.bridge_version, p.target_vocab_sha256, p.draft_vocab_sha256) == ("1", TV, DV)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.pop("draft_vocab_sha256"), "needs draft_vocab_sha256"),
    (lambda p: p.update(target_vocab_sha256="xyz"), "64 lowercase hex"),
    (lambda p: p.update(draft="s"), "shares the tokenizer"),
    (lambda p: p.pop("draft"), "needs draft"),
])
def test_malformed_bridge_pairs_are_refused(edit, message):
    doc = copy.deepcopy(_doc())
    edit(doc["pairs"][0])
    with pytest.raises(ModelError, match=message):
        _load(doc)


def test_pins_belong_to_bridge_pairs_only():
    doc = copy.deepcopy(_doc())
    doc["pairs"].append({"target": "t", "proposer": "ngram", "bridge_version": "1"})
    with pytest.raises(ModelError, match="only a 'bridge' pair"):
        _load(doc)


def test_the_repo_pins_both_drafts_for_both_qwen_targets():
    reg = registry.Registry.load(REPO_TOML)
    for target in ("qwen-1.5b", "qwen-0.5b"):
        for draft in ("smollm2-135m", "gemma-270m"):
            p = reg.pair(target, f"bridge:{draft}")
            assert p.bridge_version == BRIDGE_VERSION


class _Model:
    def __init__(self, name: str) -> None:
        self.path = Path(f"/models/{name}.gguf")


def _check(tmp_path, monkeypatch, digests: dict, version: str = BRIDGE_VERSION):
    from registry_fakes import to_toml
    path = tmp_path / "models.toml"
    path.write_text(to_toml(_doc()))
    monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(path))
    monkeypatch.setattr(bridge_pins, "vocab_digest", lambda m: digests[m.path.stem])
    return bridge_pins.check_pair(_Model("t"), _Model("d"), version)


def test_a_pinned_pair_passes(tmp_path, monkeypatch):
    assert _check(tmp_path, monkeypatch, {"t": TV, "d": DV}).draft == "d"


def test_a_changed_tokenizer_is_refused_until_requalified(tmp_path, monkeypatch):
    with pytest.raises(bridge_pins.UnqualifiedBridgeError) as e:
        _check(tmp_path, monkeypatch, {"t": TV, "d": "c" * 64})
    msg = str(e.value)
    assert "tokenizer of draft d" in msg and "c" * 64 in msg and DV in msg
    assert "python -m edgespec.registry.bridge_pins t d" in msg
    assert isinstance(e.value, InvalidInputError)  # skipped quietly when not asked for


def test_another_bridge_version_is_refused(tmp_path, monkeypatch):
    with pytest.raises(bridge_pins.UnqualifiedBridgeError, match="bridge version 1, this .* 2"):
        _check(tmp_path, monkeypatch, {"t": TV, "d": DV}, version="2")


def test_an_unknown_pair_is_refused(tmp_path, monkeypatch):
    from registry_fakes import to_toml
    doc = _doc()
    doc["pairs"] = []
    path = tmp_path / "models.toml"
    path.write_text(to_toml(doc))
    monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(path))
    monkeypatch.setattr(bridge_pins, "vocab_digest", lambda m: TV)
    with pytest.raises(bridge_pins.UnqualifiedBridgeError, match="no bridge pair in models.toml"):
        bridge_pins.check_pair(_Model("t"), _Model("d"), BRIDGE_VERSION)
