"""Issue 39's TUI polish: the proposer picker one key away, ctrl+a selects all, the last
requests table fits at 160 columns and scrolls below, and the header speaks plainly."""
from __future__ import annotations

from textual.widgets import DataTable, Input, Select

from edgespec.api.events import Control
from edgespec.tui import ScriptedSource, create_app
from edgespec.tui.demo import demo_events
from edgespec.tui.help import KEYS
from edgespec.tui.render import CONTROL_WORDS, control_words
from edgespec.tui.widgets import PromptArea
from tui_helpers import run_request, sync


@sync
async def test_f4_opens_the_proposer_picker_from_anywhere(fixed_memory):
    app = create_app(ScriptedSource(demo_events), memory_probe=fixed_memory)
    async with app.run_test(size=(80, 24)) as pilot:  # narrow: the settings panel is hidden
        assert not app.query_one("#settings").display
        await pilot.press("f4")
        await pilot.pause()
        select = app.query_one("#proposer", Select)
        assert app.query_one("#settings").display and select.expanded
        assert select in app.focused.ancestors_with_self  # its open list has the keys
    assert any(k.startswith("F4") for k, _ in KEYS)


@sync
async def test_ctrl_a_selects_all_in_the_prompt_and_in_inputs(fixed_memory):
    app = create_app(ScriptedSource(demo_events), memory_probe=fixed_memory, initial_prompt="two\nlines")
    async with app.run_test(size=(160, 45)) as pilot:
        prompt = app.query_one(PromptArea)
        prompt.focus()
        await pilot.press("ctrl+a")
        assert prompt.selected_text == "two\nlines"
        seed = app.query_one("#seed", Input)
        seed.focus()
        seed.value = "1234"
        await pilot.press("ctrl+a")
        assert seed.selected_text == "1234"
        await pilot.press("9")  # typing replaces the selection, as everywhere else
        assert seed.value == "9"


@sync
async def test_the_requests_table_fits_at_160_columns_and_scrolls_below(fixed_memory):
    for width, fits in ((160, True), (100, False)):
        app = create_app(ScriptedSource(demo_events), memory_probe=fixed_memory, initial_prompt="hi")
        async with app.run_test(size=(width, 45)) as pilot:
            await run_request(pilot, app)
            await pilot.pause()
            table = app.query_one("#history", DataTable)
            assert table.row_count == 1
            assert (table.virtual_size.width <= table.scrollable_content_region.width) is fits
            if not fits:  # every column is still reachable, with the keys
                table.focus()
                await pilot.press(*["right"] * 30)
                await pilot.pause()
                assert table.scroll_x == table.max_scroll_x > 0


@sync
async def test_the_header_says_what_the_controller_did_in_plain_words(fixed_memory):
    events = [Control(1, "guard_off", "canary: 0.81x plain over 128 steps (lcb 0.7)",
                      proposer="ngram")]
    app = create_app(ScriptedSource(events), memory_probe=fixed_memory, initial_prompt="hi")
    async with app.run_test(size=(160, 45)) as pilot:
        await run_request(pilot, app)
        status = str(app.query_one("#status").render())
        assert "drafting paused: it was slower than plain decoding" in status
        assert "lcb" not in status and "ctrl" not in status
    assert control_words("probe", "draft") == "trying draft again to see if it pays now"
    assert all("{" not in control_words(k, "x", 3) for k in CONTROL_WORDS)
