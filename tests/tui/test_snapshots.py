"""SVG snapshots of the main screen after the demo request, at 80x24 and 120x40.

Update after an intended change with `pytest tests/tui --snapshot-update` and look
at the report before committing the new SVGs.
"""
from __future__ import annotations

from edgespec.tui import ScriptedSource, create_app
from edgespec.tui.demo import DEMO_PROMPT, demo_events
from edgespec.tui.widgets import PromptArea
from tui_helpers import MIB, run_request, wait_for


def _app():
    return create_app(ScriptedSource(demo_events), memory_probe=lambda: 412 * MIB,
                      initial_prompt=DEMO_PROMPT)


def _steady(pilot) -> None:
    # a blinking cursor would make two screenshots of the same state differ
    pilot.app.query_one(PromptArea).cursor_blink = False


async def _run_demo(pilot) -> None:
    _steady(pilot)
    await run_request(pilot, pilot.app)
    box = pilot.app.query_one("#answer-box")
    await wait_for(pilot, lambda: box.max_scroll_y == 0 or box.scroll_y == box.max_scroll_y)
    await pilot.pause()


def test_main_screen_80x24(snap_compare):
    assert snap_compare(_app(), terminal_size=(80, 24), run_before=_run_demo)


def test_main_screen_120x40(snap_compare):
    assert snap_compare(_app(), terminal_size=(120, 40), run_before=_run_demo)


def test_settings_panel_160x45(snap_compare):
    # wide enough for settings, answer and panels side by side, before any request
    assert snap_compare(_app(), terminal_size=(160, 45), run_before=_steady)


def test_help_screen_80x24(snap_compare):
    assert snap_compare(_app(), terminal_size=(80, 24), press=["f1"], run_before=_steady)
