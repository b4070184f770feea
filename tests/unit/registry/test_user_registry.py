"""The user registry layered over the shipped one, and the TOML it is written back with."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from edgespec import registry
from edgespec.errors import ModelError
from edgespec.registry import toml_write, user


def test_the_registry_ships_as_package_data():
    path = registry.shipped_registry_path()
    assert path.is_file() and path.parent == Path(registry.__file__).parent
    assert "smollm2-135m" in registry.Registry.load(path).models


def test_toml_write_round_trips_the_shipped_registry():
    raw = tomllib.loads(registry.shipped_registry_path().read_text())
    text = toml_write.dumps(raw, header="a header\nof two lines")
    assert text.startswith("# a header\n# of two lines\n")
    assert tomllib.loads(text) == raw


def test_toml_write_refuses_what_it_cannot_write():
    with pytest.raises(TypeError):
        toml_write.dumps({"x": None})
    with pytest.raises(TypeError):
        toml_write.dumps({"x": float("nan")})


def test_a_local_gguf_path_needs_no_registry_file(world, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(tmp_path / "absent.toml"))
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(world.gguf)
    assert registry.resolve(str(mine)) == mine.resolve()
    with pytest.raises(ModelError, match="absent.toml not found"):
        registry.resolve("some-name")


def test_user_models_and_pairs_layer_over_the_shipped_registry(world, tmp_path):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(world.gguf)
    spec = user.add("my-draft", mine, role="draft", tokenizer="tiny-bpe-4",
                    progress=lambda m: None)
    assert spec.local and spec.path == mine and spec.source is None
    # a pair of a shipped target with the user's draft, added by hand to the user file
    path = world.home / "models.toml"
    path.write_text(path.read_text() + '\n[[pairs]]\ntarget = "tiny-whole"\n'
                                       'proposer = "draft"\ndraft = "my-draft"\n')
    reg = registry.load_registry()
    assert reg.origin("my-draft") == "user" and reg.origin("tiny-whole") == "shipped"
    assert reg.user_path == path
    assert reg.pair("tiny-whole", "my-draft").draft == "my-draft"
    assert registry.model_path("my-draft") == mine
    assert registry.pull("my-draft", progress=lambda m: None) == mine  # nothing to download
    entry, dropped = user.remove("my-draft")
    assert entry["sha256"] == spec.sha256 and [p["draft"] for p in dropped] == ["my-draft"]
    assert "my-draft" not in registry.load_registry().models
    assert tomllib.loads(path.read_text()) == {"schema": 1, "models": {}, "pairs": []}


def test_user_entries_are_validated_like_shipped_ones(world, tmp_path):
    path = world.home / "models.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {k: v for k, v in world.doc()["models"]["tiny-whole"].items() if k != "source"}
    cases = [
        ({"schema": 1, "models": {"a": entry}}, "needs exactly one of path"),
        ({"schema": 1, "models": {"a": {**entry, "path": "rel/x.gguf"}}}, "absolute path"),
        ({"schema": 2, "models": {}}, "reads schema 1"),
        ({"schema": 1, "defaults": {"target": "a"}}, "unknown key defaults"),
    ]
    from registry_fakes import to_toml
    for doc, message in cases:
        path.write_text(to_toml(doc))
        with pytest.raises(ModelError, match=message):
            registry.load_registry()


def test_a_user_model_stamp_lives_in_the_home_not_beside_the_file(world, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    mine = folder / "mine.gguf"
    mine.write_bytes(world.gguf)
    user.add("my-tiny", mine, progress=lambda m: None)
    assert sorted(p.name for p in folder.iterdir()) == ["mine.gguf"]
    assert registry.model_status("my-tiny") == "verified"
