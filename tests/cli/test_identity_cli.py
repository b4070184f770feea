"""`edgespec identity` and the identity in `generate --json`, on an engine over the fake
backend (Engine.from_config is replaced, so no model loads)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgespec.cli import cli
from edgespec.engine.engine import Engine
from fakes import FakeModel, ScriptedProposer, fake_engine


@pytest.fixture
def fake_load(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    seen = []

    def from_config(config, sinks=()):
        seen.append(config)
        model = FakeModel()
        return fake_engine(model, {"scripted": ScriptedProposer(model, [2])})
    monkeypatch.setattr(Engine, "from_config", staticmethod(from_config))
    return seen


def test_identity_json_is_the_full_record(fake_load):
    r = CliRunner().invoke(cli, ["identity", "--json", "--target", "x.gguf", "--threads", "1"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["schema"] == 1 and len(d["hash"]) == 64
    assert set(d["components"]) >= {"target", "edgespec", "llama_cpp", "kernel", "runtime",
                                    "policy", "features", "hardware"}
    assert fake_load[0].threads == 1  # the shared engine flags reach the config (at most the cores)


def test_identity_text_names_the_hash(fake_load):
    r = CliRunner().invoke(cli, ["identity"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("identity ") and "kernel:" in r.output


def test_generate_json_carries_the_identity(fake_load):
    r = CliRunner().invoke(cli, ["generate", "--raw", "--json", "--max-tokens", "4", "a"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output.strip().splitlines()[-1])
    assert rec["identity"] == rec["identity_record"]["hash"] and len(rec["identity"]) == 64
