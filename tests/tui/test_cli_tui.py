"""`edgespec tui`: options reach the app factory (the app itself is not run here)."""
from __future__ import annotations

from click.testing import CliRunner

from edgespec import tui
from edgespec.cli import cli
from edgespec.tui.demo import DEMO_PROMPT
from edgespec.tui.source import EngineSource, ScriptedSource


def _capture(monkeypatch) -> list:
    made = []

    class FakeApp:
        def run(self):
            made.append("ran")

    def fake_create_app(source, **kw):
        made.append((source, kw))
        return FakeApp()

    monkeypatch.setattr(tui, "create_app", fake_create_app)
    return made


def test_demo_replays_the_script_with_its_prompt(monkeypatch):
    made = _capture(monkeypatch)
    result = CliRunner().invoke(cli, ["tui", "--demo"])
    assert result.exit_code == 0, result.output
    (source, kw), ran = made
    assert isinstance(source, ScriptedSource) and source.realtime
    assert kw["initial_prompt"] == DEMO_PROMPT and kw["settings"] is None and ran == "ran"


def test_model_options_become_the_initial_settings(monkeypatch):
    made = _capture(monkeypatch)
    result = CliRunner().invoke(cli, ["tui", "-m", "/models/x.gguf", "-p", "suffix",
                                      "--max-draft", "3", "--n-ctx", "1024", "--prompt", "hi"])
    assert result.exit_code == 0, result.output
    source, kw = made[0]
    assert isinstance(source, EngineSource) and source.n_ctx == 1024
    s = kw["settings"]
    assert (s.target, s.proposer, s.draft, s.max_draft) == ("/models/x.gguf", "suffix", None, 3)
    assert kw["initial_prompt"] == "hi"


def test_help_lists_the_keys():
    result = CliRunner().invoke(cli, ["tui", "--help"])
    assert result.exit_code == 0 and "ctrl+r run" in result.output
