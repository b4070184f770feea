"""The TUI opens on the engine's defaults, the ones every other adapter starts from.

One source: the field defaults of ``EngineConfig`` (edgespec.config) for the engine,
``GenerationParams`` for a request. Each test compares an adapter with a *built* config, so
it fails when an adapter keeps a default of its own that differs (the TUI once opened on
ngram while ``edgespec generate``, ``Engine.load`` and ``edgespec serve`` ran auto).
"""
from __future__ import annotations

import inspect

import pytest
from click.testing import CliRunner
from textual.widgets import Checkbox, Select

from edgespec import tui
from edgespec.api.params import GenerationParams
from edgespec.cli import cli
from edgespec.config import EngineConfig
from edgespec.tui import ScriptedSource, Settings, create_app
from edgespec.tui.source import EngineSource
from edgespec.tui.widgets import Tick
from tui_helpers import run_request, script, sync

ENGINE = EngineConfig(target="t")  # an instance: what an engine built with no choices runs
REQUEST = GenerationParams()
HELLO = script([("Hello", "target")], [(" wor", "draft"), ("ld", "draft"), ("!", "target")])


def engine_defaults(s: Settings) -> tuple:
    return (s.proposer, s.draft, s.exact, s.max_draft)


def request_defaults(s: Settings) -> tuple:
    return (s.max_tokens, s.temperature, s.seed, s.stop)


ENGINE_DEFAULTS = (ENGINE.proposer, ENGINE.draft, ENGINE.exact, ENGINE.max_draft)
REQUEST_DEFAULTS = (REQUEST.max_tokens, REQUEST.sampling.temperature, REQUEST.sampling.seed,
                    REQUEST.stop)


@sync
async def test_the_tui_opens_on_the_engines_defaults(fixed_memory):
    source = ScriptedSource(HELLO)  # its pickers list the registry's proposers, as the real one
    app = create_app(source, memory_probe=fixed_memory, initial_prompt="hi")
    async with app.run_test(size=(160, 45)) as pilot:
        opened = app.current_settings()
        assert engine_defaults(opened) == ENGINE_DEFAULTS
        assert request_defaults(opened) == REQUEST_DEFAULTS
        # the widgets themselves, not only what current_settings makes of them
        assert app.query_one("#proposer", Select).value == (ENGINE.proposer, ENGINE.draft)
        assert app.query_one("#exact", Checkbox).value is ENGINE.exact
        assert app.query_one("#max-draft").value == ""  # blank: adaptive, the engine's
        # and a run sends exactly that
        await run_request(pilot, app)
        assert source.requests[0][1] == opened


def test_a_settings_value_starts_from_the_same_defaults():
    s = Settings(target="t")
    assert engine_defaults(s) == ENGINE_DEFAULTS and request_defaults(s) == REQUEST_DEFAULTS


@sync
async def test_auto_and_exact_can_be_picked_and_reach_the_request(fixed_memory):
    source = ScriptedSource(HELLO)
    app = create_app(source, memory_probe=fixed_memory, initial_prompt="hi")
    async with app.run_test(size=(160, 45)) as pilot:
        proposer = app.query_one("#proposer", Select)
        offered = [v for _, v in proposer._options if v != Select.BLANK]
        assert ("auto", None) in offered and ("none", None) in offered
        proposer.value = ("none", None)
        exact = app.query_one("#exact", Tick)
        exact.value = not ENGINE.exact
        await pilot.pause()
        assert app.current_settings().proposer == "none"
        proposer.value = ("auto", None)
        await pilot.pause()
        await run_request(pilot, app)
        sent = source.requests[0][1]
        assert sent.proposer == "auto" and sent.exact is (not ENGINE.exact)


@sync
async def test_an_unticked_box_is_drawn_empty(fixed_memory):
    # Textual draws an X in both states, coloured apart; "exact greedy" off read as ticked
    app = create_app(ScriptedSource(HELLO), memory_probe=fixed_memory)
    async with app.run_test(size=(160, 45)) as pilot:
        box = app.query_one("#exact", Tick)
        box.value = False
        await pilot.pause()
        assert box.render().plain.startswith("▐ ▌")
        box.value = True
        await pilot.pause()
        assert box.render().plain.startswith("▐X▌")


def test_the_engine_source_loads_what_engine_load_would_by_default():
    loads: list[dict] = []

    class Fake:
        proposers: dict = {}

        def __init__(self, **kw):
            loads.append(kw)

        def stream(self, prompt, params, proposer=None, exact=None):
            return iter(())

    src = EngineSource(loader=lambda **kw: Fake(**kw))
    list(src.start("hi", Settings(target="t")))
    (kw,) = loads
    # auto is planned by the engine at load (Engine.from_config -> planner), as for the CLI;
    # exact is left to Engine.load's default
    assert kw["proposer"] == ENGINE.proposer and kw["draft"] == ENGINE.draft
    assert kw["n_ctx"] == ENGINE.n_ctx and kw["threads"] == ENGINE.threads
    assert kw.get("exact", ENGINE.exact) == ENGINE.exact


def test_edgespec_tui_opens_on_the_engines_defaults(monkeypatch):
    made = []

    class FakeApp:
        def run(self):
            pass

    monkeypatch.setattr(tui, "create_app", lambda source, **kw: made.append((source, kw))
                        or FakeApp())
    result = CliRunner().invoke(cli, ["tui", "-m", "/models/x.gguf"])
    assert result.exit_code == 0, result.output
    ((source, kw),) = made
    assert engine_defaults(kw["settings"]) == ENGINE_DEFAULTS
    assert source.n_ctx == ENGINE.n_ctx and source.threads == ENGINE.threads


@pytest.mark.parametrize("command", ["generate", "chat", "plan", "serve", "identity"])
def test_the_cli_flags_default_to_the_engine_config(command):
    params = {p.name: p.default for p in cli.commands[command].params}
    assert (params["proposer"], params["exact"]) == (ENGINE.proposer, ENGINE.exact)


def test_the_python_api_defaults_to_the_engine_config():
    from edgespec.apps.llama_compat import Llama
    from edgespec.engine.engine import Engine

    for fn in (Engine.load, Llama.__init__):
        p = inspect.signature(fn).parameters
        assert (p["proposer"].default, p["exact"].default) == (ENGINE.proposer, ENGINE.exact), fn
