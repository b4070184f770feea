"""The TUI's conversation: with "keep it" on, each run sends the whole conversation, earlier
turns stay above the answer with the prompt tokens their request reused, ctrl+n starts over,
and in exact mode the answer's KV is refreshed between turns until the next run stops it."""
from __future__ import annotations

import time

from textual.widgets import Checkbox, DataTable

from edgespec.api.events import Finished
from edgespec.tui import ScriptedSource, create_app
from edgespec.tui.conversation import Transcript
from edgespec.tui.widgets import AnswerView, PromptArea

from tui_helpers import MIB, run_request, script, sync, wait_for

D, T = "draft", "target"


def chat_script(prompt, settings):
    """Answers "Hello world!" to any message; a turn after the first reuses 3 of 5 tokens."""
    events = script([("Hello", T)], [(" wor", D), ("ld", D), ("!", T)])
    if isinstance(prompt, list) and len(prompt) > 1:
        fin = events[-1]
        assert isinstance(fin, Finished)
        fin.stats.prompt_reused = 3
    return events


async def type_and_run(pilot, app, text: str) -> None:
    app.query_one(PromptArea).load_text(text)
    await run_request(pilot, app)


async def keep_conversation(pilot, app, exact: bool = False) -> None:
    app.query_one("#conversation", Checkbox).value = True
    app.query_one("#exact", Checkbox).value = exact
    await pilot.pause()


@sync
async def test_each_turn_sends_the_conversation_and_shows_what_was_reused():
    source = ScriptedSource(chat_script)
    app = create_app(source, memory_probe=lambda: 100 * MIB)
    async with app.run_test(size=(120, 40)) as pilot:
        await keep_conversation(pilot, app)
        await type_and_run(pilot, app, "hi")
        assert source.requests[0][0] == [{"role": "user", "content": "hi"}]
        assert app.query_one(PromptArea).text == ""  # the message moved to the transcript
        await type_and_run(pilot, app, "more")
        assert source.requests[1][0] == [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "Hello world!"},
                                         {"role": "user", "content": "more"}]
        view = app.query_one(AnswerView)
        shown = view.styled_text().plain
        assert "turn 1 · reused 0/5 prompt tokens\nhi\n" in shown
        assert shown.endswith("▸ you · turn 2\nmore\n◂ answer\nHello world!")
        assert view.plain == "Hello world!"  # the answer itself, apart from the context
        table = app.query_one("#history", DataTable)
        assert [table.get_row_at(i)[3] for i in range(2)] == ["0/5", "3/5"]
        assert "reused 3/5" in str(app.query_one("#answer-box").border_subtitle)
        assert "chat: 2 turns" in str(app.query_one("#status").render())
        # greedy: each answer's KV is prefilled again while it is read (unseeded sampling
        # would reuse it as it is)
        await wait_for(pilot, lambda: len(source.settled) == 2)

        await pilot.press("ctrl+n")
        assert len(app.transcript) == 0 and view.styled_text().plain == ""
        await type_and_run(pilot, app, "again")
        assert source.requests[2][0] == [{"role": "user", "content": "again"}]


@sync
async def test_without_keep_it_a_run_sends_the_prompt_alone():
    source = ScriptedSource(chat_script)
    app = create_app(source, memory_probe=lambda: 100 * MIB, initial_prompt="hi")
    async with app.run_test(size=(120, 40)) as pilot:
        await run_request(pilot, app)
        await run_request(pilot, app)
        assert [p for p, _ in source.requests] == ["hi", "hi"]
        assert len(app.transcript) == 0 and app.query_one(PromptArea).text == "hi"


@sync
async def test_exact_turns_refresh_the_kv_until_the_next_run():
    source = ScriptedSource(chat_script)
    source.settle_steps = 1000  # a long refresh: 10 s unless stopped
    app = create_app(source, memory_probe=lambda: 100 * MIB)
    async with app.run_test(size=(120, 40)) as pilot:
        await keep_conversation(pilot, app, exact=True)
        await type_and_run(pilot, app, "hi")
        assert source.requests[0][1].exact
        await wait_for(pilot, lambda: source.settled)
        assert app.settling and "refreshing KV" in app._phase and not app.running
        t0 = time.monotonic()
        await type_and_run(pilot, app, "more")  # the new run stops the refresh
        await wait_for(pilot, lambda: source.settle_returns)
        assert time.monotonic() - t0 < 5 and source.settle_returns[0] < 16 * 1000
        await wait_for(pilot, lambda: len(source.settled) == 2)  # turn 2's own refresh
        assert app.settling
        await pilot.press("ctrl+n")  # starting over stops it too
        await wait_for(pilot, lambda: len(source.settle_returns) == 2 and not app.settling)
        assert source.settle_returns[1] < 16 * 1000


@sync
async def test_a_finished_refresh_says_how_much_it_refreshed():
    source = ScriptedSource(chat_script)
    source.settle_steps = 2
    app = create_app(source, memory_probe=lambda: 100 * MIB)
    async with app.run_test(size=(120, 40)) as pilot:
        await keep_conversation(pilot, app, exact=True)
        await type_and_run(pilot, app, "hi")
        await wait_for(pilot, lambda: not app.settling and source.settled)
        await pilot.pause()
        assert "KV refreshed (32 tok)" in app._phase


def test_a_cancelled_turn_that_showed_nothing_leaves_no_message():
    events = script([("x", T)], stop="cancelled")
    fin = events[-1]
    t = Transcript()
    assert t.record("a", Finished(1, "", (), "cancelled", fin.stats)) is None
    assert t.record("b", fin).answer == "x" and len(t) == 1
    assert t.messages("c") == [{"role": "user", "content": "b"},
                               {"role": "assistant", "content": "x"},
                               {"role": "user", "content": "c"}]


def _two_turns_app():
    source = ScriptedSource(chat_script)
    return create_app(source, memory_probe=lambda: 412 * MIB)


async def _two_turns(pilot) -> None:
    pilot.app.query_one(PromptArea).cursor_blink = False
    await keep_conversation(pilot, pilot.app)
    await type_and_run(pilot, pilot.app, "Name a colour.")
    await type_and_run(pilot, pilot.app, "And another one?")
    await wait_for(pilot, lambda: len(pilot.app.source.settled) == 2 and not pilot.app.settling)
    await pilot.pause()


def test_conversation_screen_120x40(snap_compare):
    assert snap_compare(_two_turns_app(), terminal_size=(120, 40), run_before=_two_turns)
