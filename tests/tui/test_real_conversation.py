"""The TUI's conversation over the real engine on SmolLM2-135M (slow): with "keep it" and
"exact greedy" on, the answer's KV is refreshed between turns and turn 2 reuses it."""
from __future__ import annotations

import pytest
from textual.widgets import Checkbox

from edgespec.api.events import Finished
from edgespec.tui import EngineSource, Settings, create_app
from edgespec.tui.widgets import PromptArea
from tui_helpers import run_request, sync, wait_for

pytestmark = pytest.mark.slow


class Recording(EngineSource):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.finished: list[Finished] = []

    def start(self, prompt, settings):
        for ev in super().start(prompt, settings):
            if isinstance(ev, Finished):
                self.finished.append(ev)
            yield ev


@sync
async def test_an_exact_conversation_reuses_the_refreshed_answer(model_path):
    source = Recording(n_ctx=1024, threads=1)
    settings = Settings(target=str(model_path("smollm2-135m")), proposer="ngram",
                        max_tokens=40, exact=True)
    app = create_app(source, settings=settings)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            app.query_one("#conversation", Checkbox).value = True
            assert app.query_one("#exact", Checkbox).value
            app.query_one(PromptArea).load_text("Name three colours.")
            await run_request(pilot, app, timeout=120)
            await wait_for(pilot, lambda: not app.settling, timeout=120)
            assert "KV refreshed" in app._phase and not app.errors, app.errors
            app.query_one(PromptArea).load_text("And three animals?")
            await run_request(pilot, app, timeout=120)
            t1, t2 = source.finished
            held = t1.stats.prompt_tokens + len(t1.tokens)
            # without the refresh exact mode would reuse at most turn 1's prompt
            assert t2.stats.prompt_reused > held - 12 > t1.stats.prompt_tokens
            assert len(app.transcript) == 2
            await wait_for(pilot, lambda: not app.settling, timeout=120)
    finally:
        source.close()
