"""The app over the real engine on SmolLM2-135M (slow: loads llama.cpp and a model)."""
from __future__ import annotations

import pytest

from edgespec.api.events import Finished, RequestStarted, Step
from edgespec.tui import EngineSource, Settings, create_app
from edgespec.tui.widgets import DRAFT, AnswerView
from tui_helpers import run_request, start_request, sync, wait_done, wait_for

pytestmark = pytest.mark.slow

PROMPT = ("Copy this list exactly, one item per line: apple, banana, cherry, apple, banana, "
          "cherry, apple, banana, cherry")


class Recording(EngineSource):
    """The real source, keeping every event it hands the UI (on the worker thread)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seen: list = []

    def start(self, prompt, settings):
        for ev in super().start(prompt, settings):
            self.seen.append(ev)
            yield ev


def _app(model_path, *, max_tokens: int):
    source = Recording(n_ctx=1024, threads=2)
    settings = Settings(target=str(model_path("smollm2-135m")), proposer="ngram",
                        max_tokens=max_tokens)
    return create_app(source, initial_prompt=PROMPT, settings=settings), source


@sync
async def test_streams_a_real_answer_with_origins_coloured(model_path):
    app, source = _app(model_path, max_tokens=16)
    seen = source.seen
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await run_request(pilot, app, timeout=120)
            assert not app.errors, app.errors
            fin = next(e for e in seen if isinstance(e, Finished))
            steps = [e for e in seen if isinstance(e, Step)]
            view = app.query_one(AnswerView)
            assert fin.text and view.plain == fin.text
            assert all("".join(s.pieces) == s.text for s in steps)
            drafted_chars = sum(len(p) for s in steps for p, o in zip(s.pieces, s.origins)
                                if o == DRAFT)
            text = view.styled_text()
            draft_style = view.origin_styles()[DRAFT]
            coloured = sum(sp.end - sp.start for sp in text.spans if sp.style == draft_style)
            assert coloured == drafted_chars
            assert app.query_one("#history").row_count == 1

            # the plain path on the same target reuses the loaded engine
            engine = source._engine
            app.query_one("#proposer").value = ("none", None)
            seen.clear()
            await run_request(pilot, app, timeout=120)
            assert source._engine is engine and not app.errors
            assert app.metrics.plain_estimate().basis == "measured"
    finally:
        source.close()


@sync
async def test_cancel_stops_a_real_stream(model_path):
    app, source = _app(model_path, max_tokens=1000)
    seen = source.seen
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            start_request(app)
            await wait_for(pilot, lambda: app.metrics.stats.generated_tokens >= 4, timeout=120)
            await pilot.press("escape")
            await wait_done(pilot, app, timeout=30)
            fin = next(e for e in seen if isinstance(e, Finished))
            assert fin.stop_reason == "cancelled" and fin.stats.generated_tokens < 1000
            assert app._phase == "cancelled"
    finally:
        source.close()


@sync
async def test_the_default_auto_is_planned_by_the_engine(model_path):
    # no proposer given: the TUI's default is the engine's, auto, which Engine.load plans
    source = Recording(n_ctx=1024, threads=2)
    app = create_app(source, initial_prompt=PROMPT,
                     settings=Settings(target=str(model_path("smollm2-135m")), max_tokens=8))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            assert app.current_settings().proposer == "auto"
            await run_request(pilot, app, timeout=300)
            assert not app.errors, app.errors
            started = next(e for e in source.seen if isinstance(e, RequestStarted))
            plan = source._engine.plan
            assert plan is not None and started.proposer == plan.config.proposer != "auto"
            row = app.query_one("#history").get_row_at(0)
            assert row[1] == f"auto→{started.proposer}"
    finally:
        source.close()
