"""Pilot tests of the app over a scripted event source."""
from __future__ import annotations

from textual.widgets import DataTable, Input, Select

from edgespec.errors import ContextOverflowError, IncompatibleDraftError
from edgespec.api.events import PrefillDone, RequestStarted
from edgespec.tui import Choices, ScriptedSource, Settings, create_app
from edgespec.tui.help import HelpScreen
from edgespec.tui.widgets import AnswerView, PromptArea

from tui_helpers import run_request, script, start_request, sync, wait_done, wait_for

D, T = "draft", "target"
HELLO = script([("Hello", T)], [(" wor", D), ("ld", D), ("!", T)], [("\n", T)])


def answer(app) -> AnswerView:
    return app.query_one(AnswerView)


@sync
async def test_typing_a_prompt_streams_the_answer(fixed_memory):
    source = ScriptedSource(HELLO)
    app = create_app(source, memory_probe=fixed_memory)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(*"hi there")
        await run_request(pilot, app)
        prompt, settings = source.requests[0]
        assert prompt == "hi there"
        assert settings.proposer == "auto" and settings.max_tokens == 256  # the engine's default
        assert answer(app).plain == "Hello world!\n"
        table = app.query_one("#history", DataTable)
        assert table.row_count == 1
        row = table.get_row_at(0)
        # auto says what the request ran (RequestStarted: the plan's proposer)
        assert row[1] == "auto→ngram" and row[2] == "5" and row[3] == "0/5" and row[7] == "length"
        assert "5 tok" in str(app.query_one("#answer-box").border_subtitle)
        assert app._phase == "done" and not app.errors
        # the run button is usable again and a second request appends to the history
        await run_request(pilot, app)
        assert table.row_count == 2 and len(source.requests) == 2


@sync
async def test_accepted_draft_and_target_tokens_are_coloured_apart(fixed_memory):
    app = create_app(ScriptedSource(HELLO), memory_probe=fixed_memory, initial_prompt="x")
    async with app.run_test(size=(80, 24)) as pilot:
        await run_request(pilot, app)
        view = answer(app)
        styles = view.origin_styles()
        assert styles[D].color != styles[T].color
        text = view.styled_text()
        runs = [(text.plain[s.start:s.end], s.style) for s in text.spans]
        assert runs == [("Hello", styles[T]), (" world", styles[D]), ("!\n", styles[T])]
        # the legend uses the same two styles
        legend = app.query_one("#legend").render()
        assert "accepted draft" in str(legend)

        await pilot.press("f3")  # colouring off: same text, no origin styles
        plain = view.styled_text()
        assert plain.plain == "Hello world!\n" and plain.spans == []
        assert "colouring off" in str(app.query_one("#legend").render())
        await pilot.press("f3")
        assert view.styled_text().spans


@sync
async def test_escape_cancels_mid_stream(fixed_memory):
    steps = [[(f" w{i}", D), (f" t{i}", T)] for i in range(200)]
    source = ScriptedSource(script(*steps), delay=0.02)
    app = create_app(source, memory_probe=fixed_memory, initial_prompt="long one")
    async with app.run_test(size=(80, 24)) as pilot:
        start_request(app)
        await wait_for(pilot, lambda: app.metrics.stats.generated_tokens >= 4)
        assert app.running and not app.query_one("#cancel").disabled
        await pilot.press("escape")
        await wait_done(pilot, app, timeout=5)
        assert app._phase == "cancelled"
        n = app.metrics.stats.generated_tokens
        assert 4 <= n < 400
        assert len(answer(app).plain) < len("".join(p for s in steps for p, _ in s))
        row = app.query_one("#history", DataTable).get_row_at(0)
        assert row[7] == "cancelled"
        assert app.query_one("#cancel").disabled and not app.query_one("#run").disabled


@sync
async def test_engine_errors_show_as_notifications_and_the_app_goes_on(fixed_memory):
    failing = [RequestStarted(1, 9000, "ngram", "scripted"),
               ContextOverflowError("the prompt is 9000 tokens but the context holds 4096")]
    source = ScriptedSource(failing)
    app = create_app(source, memory_probe=fixed_memory, initial_prompt="too long")
    async with app.run_test(size=(80, 24)) as pilot:
        await run_request(pilot, app)
        notes = list(app._notifications)
        assert any(n.severity == "error" and "context holds 4096" in n.message
                   and n.title == "context full" for n in notes)
        assert app._phase == "error" and not app.running
        # still usable: the next request runs
        source.script = HELLO
        await run_request(pilot, app)
        assert answer(app).plain == "Hello world!\n"


@sync
async def test_a_context_that_fills_mid_answer_is_reported(fixed_memory):
    app = create_app(ScriptedSource(script([("a", T)], [("b", T)], stop="context")),
                     memory_probe=fixed_memory, initial_prompt="q")
    async with app.run_test(size=(80, 24)) as pilot:
        await run_request(pilot, app)
        assert answer(app).plain == "ab"
        assert any(n.title == "context full" and n.severity == "warning"
                   for n in app._notifications)


@sync
async def test_an_error_before_any_event_and_a_bug_both_notify(fixed_memory):
    source = ScriptedSource([IncompatibleDraftError("draft vocabulary differs from the target")])
    app = create_app(source, memory_probe=fixed_memory, initial_prompt="q")
    async with app.run_test(size=(80, 24)) as pilot:
        await run_request(pilot, app)
        assert any(n.title == "incompatible draft" for n in app._notifications)
        source.script = [PrefillDone(1, 1, 0.1), RuntimeError("boom")]
        await run_request(pilot, app)
        assert any(n.title == "internal error" and "RuntimeError: boom" in n.message
                   for n in app._notifications)
        assert not app.running


@sync
async def test_bad_settings_are_refused_before_anything_runs(fixed_memory):
    source = ScriptedSource(HELLO)
    app = create_app(source, memory_probe=fixed_memory, initial_prompt="q")
    async with app.run_test(size=(80, 24)) as pilot:
        app.query_one("#max-tokens", Input).value = "0"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert source.requests == [] and not app.running
        assert any("max_tokens must be >= 1" in n.message for n in app._notifications)

        app.query_one("#max-tokens", Input).value = "16"
        app.query_one("#path", Input).value = "/nonexistent/model.gguf"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert source.requests == []
        assert any("no model file" in n.message for n in app._notifications)

        app.query_one("#path", Input).value = ""
        app.query_one("#stop", Input).value = r"\n\n, END"
        app.query_one("#seed", Input).value = "42"
        await run_request(pilot, app)
        settings = source.requests[0][1]
        assert settings.max_tokens == 16 and settings.seed == 42
        assert settings.stop == ("\n\n", "END")


@sync
async def test_empty_prompt_is_not_sent(fixed_memory):
    source = ScriptedSource(HELLO)
    app = create_app(source, memory_probe=fixed_memory)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert source.requests == []
        assert any("type a prompt" in n.message for n in app._notifications)


@sync
async def test_prompt_history_with_up_and_down(fixed_memory):
    app = create_app(ScriptedSource(HELLO), memory_probe=fixed_memory)
    async with app.run_test(size=(80, 24)) as pilot:
        prompt = app.query_one(PromptArea)
        for text in ("first", "second"):
            prompt.load_text(text)
            await run_request(pilot, app)
        prompt.load_text("draft")
        await pilot.press("up")
        assert prompt.text == "second"
        await pilot.press("ctrl+up")
        assert prompt.text == "first"
        await pilot.press("down")
        assert prompt.text == "second"
        await pilot.press("down")
        assert prompt.text == "draft"


@sync
async def test_help_screen_and_settings_panel_by_keyboard(fixed_memory):
    app = create_app(ScriptedSource(HELLO), memory_probe=fixed_memory, initial_prompt="x")
    async with app.run_test(size=(80, 24)) as pilot:
        settings = app.query_one("#settings")
        assert not settings.display  # narrow: hidden until F2
        await pilot.press("f2")
        assert settings.display and app.focused.id == "target"
        assert not app.query_one("#side").display  # it takes the live panel's place
        await pilot.press("f2")
        assert not settings.display and isinstance(app.focused, PromptArea)

        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.pause(0.1)  # the refresh timer keeps running under the help screen
        await pilot.press("ctrl+r")  # no request starts from under the help screen
        assert app.requests_started == 0
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@sync
async def test_wide_screens_show_settings_by_default(fixed_memory):
    app = create_app(ScriptedSource(HELLO), memory_probe=fixed_memory)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        assert app.query_one("#settings").display and app.query_one("#side").display


@sync
async def test_panels_show_the_request_numbers(fixed_memory):
    app = create_app(ScriptedSource(HELLO), memory_probe=fixed_memory, initial_prompt="x")
    async with app.run_test(size=(120, 40)) as pilot:
        await run_request(pilot, app)
        live = str(app.query_one("#live").render())
        assert "67% req" in live  # 2 of 3 drafted tokens accepted
        assert "256 MiB RSS" in live
        hist = str(app.query_one("#hist").render())
        assert " 1 " in hist and " 3 " in hist
        assert list(app.metrics.pass_acceptance) == [2 / 3]
        spark = str(app.query_one("#spark").render()).split("\n")
        assert spark[0].strip() == "▃" and spark[1].strip() == "█"  # 2/3 of two rows


@sync
async def test_quitting_mid_stream_cancels_and_late_events_are_dropped(fixed_memory):
    steps = [[(f" w{i}", D), (f" t{i}", T)] for i in range(100)]
    source = ScriptedSource(script(*steps), delay=0.01)
    app = create_app(source, memory_probe=fixed_memory, initial_prompt="q")
    async with app.run_test(size=(80, 24)) as pilot:
        start_request(app)
        await wait_for(pilot, lambda: app.metrics.stats.generated_tokens >= 2)
        await pilot.press("ctrl+q")
    # run_test re-raises anything a handler raised while shutting down
    assert source._cancel.is_set()


@sync
async def test_a_long_answer_scrolls_to_its_end(fixed_memory):
    lines = script(*[[(f"line {i}\n", T)] for i in range(60)])
    app = create_app(ScriptedSource(lines), memory_probe=fixed_memory, initial_prompt="q")
    async with app.run_test(size=(80, 24)) as pilot:
        await run_request(pilot, app)
        box = app.query_one("#answer-box")
        await wait_for(pilot, lambda: box.max_scroll_y > 0 and box.scroll_y == box.max_scroll_y)


@sync
async def test_changing_the_target_offers_only_drafts_that_fit_it(fixed_memory):
    choices = Choices(targets=("big", "other"), drafts=("small", "tiny"),
                      compatible_drafts={"big": ("small",), "other": ("tiny",)},
                      default_target="big")
    app = create_app(ScriptedSource(HELLO, choices=choices), memory_probe=fixed_memory,
                     initial_prompt="x")
    async with app.run_test(size=(160, 45)) as pilot:
        proposer = app.query_one("#proposer", Select)

        def drafts():
            return [v[1] for _, v in proposer._options if v != Select.BLANK and v[1]]

        assert drafts() == ["small"]
        proposer.value = ("draft", "small")
        await pilot.pause()
        app.query_one("#target", Select).value = "other"
        await pilot.pause()
        assert drafts() == ["tiny"]
        # the chosen draft does not fit the new target: back to the default proposer
        assert proposer.value == ("auto", None)
        assert app.current_settings() == Settings(target="other", proposer="auto")
        # a free proposer survives a target change
        proposer.value = ("suffix", None)
        app.query_one("#target", Select).value = "big"
        await pilot.pause()
        assert drafts() == ["small"] and proposer.value == ("suffix", None)
        # a .gguf path: the registry cannot tell, so every draft is offered (to the
        # same-vocabulary draft proposer and to the bridge; the engine checks at load)
        app.query_one("#path", Input).value = "/nowhere/model.gguf"
        await pilot.pause()
        assert drafts() == ["small", "tiny", "small", "tiny"]
        assert [v[0] for _, v in proposer._options if v != Select.BLANK and v[1]] == \
            ["draft", "draft", "bridge", "bridge"]


@sync
async def test_a_draft_given_by_path_stays_listed_across_target_changes(fixed_memory):
    choices = Choices(targets=("big", "other"), drafts=("small",),
                      compatible_drafts={"big": ("small",), "other": ()})
    settings = Settings(target="big", proposer="draft", draft="/m/mine.gguf")
    app = create_app(ScriptedSource(HELLO, choices=choices), memory_probe=fixed_memory,
                     settings=settings)
    async with app.run_test(size=(160, 45)) as pilot:
        proposer = app.query_one("#proposer", Select)
        assert proposer.value == ("draft", "/m/mine.gguf")
        app.query_one("#target", Select).value = "other"
        await pilot.pause()
        assert proposer.value == ("draft", "/m/mine.gguf")


@sync
async def test_a_proposer_that_stayed_off_is_explained_in_one_line(fixed_memory):
    """The source's idle note (the engine's break-even line; edgespec.engine.notes) shows as
    a notification once the request ends; a source with nothing to say shows none."""
    class Noting(ScriptedSource):
        def idle_note(self, stats):
            return f"speculation stayed off ({stats.generated_tokens} tokens)"

    app = create_app(Noting(HELLO), memory_probe=fixed_memory)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(*"hi")
        await run_request(pilot, app)
        assert any(n.title == "speculation" and "speculation stayed off (5 tokens)" in n.message
                   for n in app._notifications)
    app = create_app(ScriptedSource(HELLO), memory_probe=fixed_memory)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(*"hi")
        await run_request(pilot, app)
        assert not any(n.title == "speculation" for n in app._notifications)
