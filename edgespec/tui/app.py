"""The Textual app: prompt, pickers, the origin-coloured answer and live speculation panels.

It consumes only ``edgespec.api.events`` from an :class:`~edgespec.tui.source.EventSource`.
The source runs on a worker thread; each event is posted to the UI as a
message, and the panels are redrawn on a short timer rather than per token, so
a fast stream cannot starve input handling.
"""
from __future__ import annotations

import functools
import threading
import traceback
from pathlib import Path
from typing import Callable

from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Checkbox, DataTable, Footer, Input, Label, Select, Static

from ..errors import Cancelled, EdgespecError, InvalidInputError
from ..api.events import Event, Finished, PrefillDone, RequestStarted, Step
from ..proposers import needs_model

from .conversation import Transcript
from .help import HelpScreen
from .metrics import LiveMetrics
from .render import (HISTORY_COLUMNS, Palette, control_words, histogram_text, history_row,
                     live_text, positions_text, spark_text, summary_line, transcript_text)
from .source import NO_PROPOSER, Choices, EngineSource, EventSource, Settings, default_proposer
from .widgets import DRAFT, TARGET, AnswerView, History, PromptArea, Tick

MemoryProbe = Callable[[], "int | None"]
HISTORY_ROWS = 20
REFRESH_SECONDS = 1 / 15


def process_rss() -> int | None:
    try:
        import psutil  # deferred: inside the try, so a platform psutil refuses shows "-"
        return psutil.Process().memory_info().rss
    except Exception:  # psutil missing or the platform refuses: show "-" rather than fail
        return None


# --- messages from the worker thread ---------------------------------------------
class StreamEvent(Message):
    def __init__(self, event: Event) -> None:
        self.event = event
        super().__init__()


class StreamFailed(Message):
    def __init__(self, error: BaseException, details: str = "") -> None:
        self.error = error
        self.details = details
        super().__init__()


class StreamEnded(Message):
    pass


class Settled(Message):
    """The idle-time work after a conversation turn ended (positions of KV refreshed)."""

    def __init__(self, stop, refreshed: int, error: BaseException | None = None) -> None:
        self.stop = stop  # which refresh this was (a later turn starts another)
        self.refreshed = refreshed
        self.error = error
        super().__init__()


def _while_mounted(handler):
    """Drop UI work that arrives after the widgets are gone (events queued before quitting)."""
    @functools.wraps(handler)
    def wrapper(self, *args):
        try:
            return handler(self, *args)
        except NoMatches:  # every widget exists while mounted; this is teardown
            return None
    return wrapper


def parse_stop(text: str) -> tuple[str, ...]:
    r"""Comma-separated stop strings; ``\n``, ``\t``, ``\,`` and ``\\`` are escapes."""
    out, cur, i = [], [], 0
    escapes = {"n": "\n", "t": "\t", ",": ",", "\\": "\\"}
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in escapes:
            cur.append(escapes[text[i + 1]])
            i += 2
            continue
        if ch == ",":
            out.append("".join(cur).strip(" "))
            cur = []
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur).strip(" "))
    return tuple(s for s in out if s)


class EdgespecApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "edgespec"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-medium"), (140, "-wide")]
    BINDINGS = [
        Binding("ctrl+r,f5", "run", "Run", priority=True),
        Binding("escape", "cancel", "Cancel"),
        Binding("f1,question_mark", "help", "Help"),
        Binding("f2", "toggle_settings", "Settings"),
        Binding("f3", "toggle_colour", "Colour"),
        Binding("f4", "pick_proposer", "Proposer"),
        # the standard select-all in every text field (Textual's own is F7 / ctrl+shift+a;
        # its ctrl+a, "line start", stays on Home)
        Binding("ctrl+a", "select_all", "Select all", show=False, priority=True),
        Binding("ctrl+n", "new_conversation", "New chat"),
        Binding("ctrl+up", "recall(-1)", "Prev prompt", show=False),
        Binding("ctrl+down", "recall(1)", "Next prompt", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, source: EventSource, *, memory_probe: MemoryProbe = process_rss,
                 initial_prompt: str = "", settings: Settings | None = None) -> None:
        super().__init__()
        self.source = source
        self.memory_probe = memory_probe
        self.initial_prompt = initial_prompt
        self.initial_settings = settings
        self.metrics = LiveMetrics()
        self.history = History()
        self.running = False
        self.cancelling = False
        self.rss: int | None = None
        self.requests_started = 0
        self.requests_done = 0
        self.errors: list[BaseException] = []
        self._plain_timing: dict[str, tuple[int, float]] = {}
        self._settings: Settings | None = None
        # a proposer choice the pickers do not list (a draft given by path), kept in the list
        self._pinned_proposer: tuple[str, tuple[str, str | None]] | None = None
        self._proposer_values: list[tuple[str, str | None]] = []
        self._panels_dirty = True
        self._phase = "idle"
        #: the conversation kept while "keep the conversation" is on (each turn sends it all)
        self.transcript = Transcript()
        self._turn_user: str | None = None  # the running request's message, in a conversation
        self._settle_stop: threading.Event | None = None  # set: the refresh should end
        self.settling = False
        try:
            self.choices = source.models()
            self._choices_error: str | None = None
        except EdgespecError as e:
            self.choices = Choices(targets=())
            self._choices_error = str(e)

    @property
    def _main(self):
        # Widgets live on the first screen; self.screen is the help screen while it is open.
        if not self.screen_stack:
            raise NoMatches("no screen: the app is shutting down")
        return self.screen_stack[0]

    # --- layout --------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        c, s = self.choices, self.initial_settings
        target = s.target if s else c.default_target
        # what the fields open on: the settings given, else the engine's and the request's
        # defaults (Settings reads them from EngineConfig and GenerationParams)
        d = s or Settings(target=target or "")
        targets = list(c.targets)
        if target and target not in targets:
            targets.insert(0, target)
        proposers = c.proposer_options(target)
        if s is not None:
            proposer_value = (s.proposer, s.draft if needs_model(s.proposer) else None)
            if proposer_value not in [v for _, v in proposers]:  # e.g. a draft given by path
                label = s.proposer + (f": {s.draft}" if proposer_value[1] else "")
                self._pinned_proposer = (label, proposer_value)
                proposers.insert(0, self._pinned_proposer)
        else:
            proposer_value = self._default_proposer_value(proposers)
        self._proposer_values = [v for _, v in proposers]

        yield Static(id="status")
        with Horizontal(id="body"):
            with VerticalScroll(id="settings"):
                yield Label("target model")
                yield Select([(t, t) for t in targets], id="target", compact=True,
                             allow_blank=not targets, **({"value": target} if target else {}))
                yield Input(placeholder="or a local .gguf path", id="path", compact=True)
                yield Label("proposer")
                yield Select(proposers, id="proposer", compact=True, allow_blank=not proposers,
                             **({"value": proposer_value} if proposer_value else {}))
                yield Label("draft length")
                yield Input("" if d.max_draft is None else str(d.max_draft),
                            id="max-draft", type="integer", placeholder="adaptive", compact=True)
                yield Label("max tokens")
                yield Input(str(d.max_tokens), id="max-tokens", type="integer",
                            compact=True)
                yield Label("temperature (0 = greedy)")
                yield Input(str(d.temperature), id="temperature", type="number",
                            compact=True)
                yield Label("seed")
                yield Input("" if d.seed is None else str(d.seed), id="seed",
                            type="integer", placeholder="random", compact=True)
                yield Label("stop strings")
                yield Input(placeholder=r"comma-separated, \n = newline", id="stop",
                            compact=True)
                yield Label("conversation")
                yield Tick("keep it (^n: new)", id="conversation", compact=True)
                yield Tick("exact greedy", d.exact, id="exact", compact=True)
            with Vertical(id="main"):
                with VerticalScroll(id="answer-box"):
                    yield AnswerView(id="answer")
                yield Static(id="legend")
                yield PromptArea(self.initial_prompt, id="prompt", soft_wrap=True,
                                 show_line_numbers=False)
                with Horizontal(id="buttons"):
                    yield Button("Run ^r", id="run", variant="primary", compact=True)
                    yield Button("Cancel esc", id="cancel", variant="error", compact=True,
                                 disabled=True)
            with VerticalScroll(id="side"):
                yield Label("acceptance per verify pass", classes="section")
                yield Static(id="spark")
                yield Static(id="live")
                yield Static(id="hist")
                yield Static(id="positions")
                yield Label("last requests", classes="section")
                yield DataTable(id="history", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self._main.query_one("#answer-box").border_title = "answer"
        self._main.query_one("#side").border_title = "speculation"
        self._main.query_one("#settings").border_title = "settings"
        self._main.query_one("#prompt").border_title = "prompt"
        self._main.query_one("#history", DataTable).add_columns(*HISTORY_COLUMNS)
        self.rss = self.memory_probe()
        self.set_interval(REFRESH_SECONDS, self._refresh_tick)
        self.set_interval(1.0, self._poll_memory)
        self._main.query_one(PromptArea).focus()
        if self._choices_error:
            self.notify(self._choices_error, title="model registry", severity="error")
        self._refresh_all()

    # --- actions ---------------------------------------------------------------------
    def action_run(self) -> None:
        if self.screen is not self._main:  # the key is global; not from under the help
            return
        if self.running:
            self.notify("a request is running: Esc cancels it", severity="warning")
            return
        prompt = self._main.query_one(PromptArea).text
        if not prompt.strip():
            self.notify("type a prompt first", severity="warning")
            return
        try:
            settings = self.current_settings()
            settings.params()
        except EdgespecError as e:
            self.notify(str(e), title="settings", severity="error")
            return
        self.history.add(prompt)
        self._settings = settings
        self._stop_settling()
        chat = self._main.query_one("#conversation", Checkbox).value
        self._turn_user = prompt if chat else None
        payload = self.transcript.messages(prompt) if chat else prompt
        self.metrics = LiveMetrics(self._plain_timing.get(settings.target, (0, 0.0)))
        answer = self._main.query_one(AnswerView)
        answer.clear()
        answer.set_context(transcript_text(self.transcript.turns, prompt) if chat else Text())
        if chat:  # the message is in the transcript now; the box is for the next one
            self._main.query_one(PromptArea).load_text("")
        box = self._main.query_one("#answer-box")
        box.border_subtitle = ""
        box.anchor(False)
        box.scroll_home(animate=False, immediate=True)
        needs_load = getattr(self.source, "needs_load", None)
        self._phase = f"loading {settings.target}…" if needs_load and needs_load(settings) else "prefill…"
        self.requests_started += 1
        self._set_running(True)
        self._panels_dirty = True
        self._refresh_all()
        self._generate(payload, settings)

    def action_cancel(self) -> None:
        if self.running and not self.cancelling:
            self.cancelling = True
            self._phase = "cancelling…"
            self.source.cancel()
            self._refresh_status()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_settings(self) -> None:
        body = self._main.query_one("#body")
        body.toggle_class("-toggled")
        settings = self._main.query_one("#settings")
        if settings.display:
            self._main.query_one("#target").focus()
        else:
            self._main.query_one(PromptArea).focus()

    def action_pick_proposer(self) -> None:
        """F4: the proposer picker, open, whatever has focus (the settings panel is shown
        first where the screen hides it)."""
        if self.screen is not self._main:
            return
        if not self._main.query_one("#settings").display:
            self.action_toggle_settings()
        select = self._main.query_one("#proposer", Select)
        select.focus()
        select.expanded = True

    def action_select_all(self) -> None:
        focused = self.focused
        if isinstance(focused, (Input, PromptArea)):
            focused.select_all()

    def action_toggle_colour(self) -> None:
        answer = self._main.query_one(AnswerView)
        answer.colour = not answer.colour
        self._refresh_legend()

    def action_new_conversation(self) -> None:
        if self.running:
            self.notify("a request is running: Esc cancels it first", severity="warning")
            return
        self._stop_settling()
        self.transcript.clear()
        answer = self._main.query_one(AnswerView)
        answer.clear()
        answer.set_context(Text())
        self._main.query_one("#answer-box").border_subtitle = ""
        self._phase = "new conversation"
        self._refresh_all()

    def action_recall(self, direction: int) -> None:
        prompt = self._main.query_one(PromptArea)
        text = self.history.recall(direction, prompt.text)
        if text is not None:
            prompt.load_text(text)
            prompt.move_cursor(prompt.document.end if direction > 0 else (0, len(
                prompt.document.get_line(0))))

    async def action_quit(self) -> None:
        if self.running:
            self.source.cancel()
        self.exit()

    @on(PromptArea.Recall)
    def _on_recall(self, message: PromptArea.Recall) -> None:
        self.action_recall(message.direction)

    @on(Button.Pressed, "#run")
    def _on_run_button(self) -> None:
        self.action_run()

    @on(Button.Pressed, "#cancel")
    def _on_cancel_button(self) -> None:
        self.action_cancel()

    @on(Select.Changed)
    @on(Input.Changed, "#path")
    def _on_settings_changed(self, message: Select.Changed | Input.Changed) -> None:
        if message.control.id in ("target", "path"):
            self._refresh_proposer_choices()
        if not self.running:
            self._refresh_status()

    # --- the proposer picker -------------------------------------------------------------
    @staticmethod
    def _default_proposer_value(options) -> tuple[str, str | None] | None:
        default = default_proposer()
        return next((v for _, v in options if v[0] == default), options[0][1] if options else None)

    @_while_mounted
    def _refresh_proposer_choices(self) -> None:
        """Offer only the drafts that share the chosen target's tokenizer (when the registry
        knows it); keep the current choice when it still fits."""
        path = self._main.query_one("#path", Input).value.strip()
        picked = self._main.query_one("#target", Select).value
        target = None if path or picked is Select.BLANK else str(picked)
        options = self.choices.proposer_options(target)
        if self._pinned_proposer is not None and self._pinned_proposer[1] not in [
                v for _, v in options]:
            options.insert(0, self._pinned_proposer)
        values = [v for _, v in options]
        if values == self._proposer_values:
            return
        select = self._main.query_one("#proposer", Select)
        current = select.value
        self._proposer_values = values
        select.set_options(options)
        keep = current if current in values else self._default_proposer_value(options)
        if keep is not None:
            select.value = keep

    # --- settings --------------------------------------------------------------------
    def current_settings(self) -> Settings:
        """Settings from the panel; InvalidInputError says which field is wrong."""
        path = self._main.query_one("#path", Input).value.strip()
        if path:
            p = Path(path).expanduser()
            if not p.is_file():
                raise InvalidInputError(f"no model file at {p}: check the path or clear it "
                                        "to use the target picker")
            target = str(p)
        else:
            value = self._main.query_one("#target", Select).value
            if value is Select.BLANK:
                raise InvalidInputError("no target model: pick one (F2) or give a .gguf path")
            target = str(value)
        choice = self._main.query_one("#proposer", Select).value
        proposer, draft = (NO_PROPOSER, None) if choice is Select.BLANK else choice
        return Settings(
            target=target,
            proposer=proposer,
            draft=draft,
            max_tokens=_number(self._main.query_one("#max-tokens", Input).value, int, "max tokens",
                               Settings.max_tokens),
            temperature=_number(self._main.query_one("#temperature", Input).value, float,
                                "temperature", Settings.temperature),
            seed=_number(self._main.query_one("#seed", Input).value, int, "seed", None),
            stop=parse_stop(self._main.query_one("#stop", Input).value),
            max_draft=_number(self._main.query_one("#max-draft", Input).value, int,
                              "draft length", None),
            exact=self._main.query_one("#exact", Checkbox).value,
        )

    # --- the worker --------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, prompt: str | list, settings: Settings) -> None:
        try:
            for event in self.source.start(prompt, settings):
                self.post_message(StreamEvent(event))
        except EdgespecError as e:
            self.post_message(StreamFailed(e))
        except Exception as e:  # a bug in a source must not take the UI down with it
            self.post_message(StreamFailed(e, traceback.format_exc()))
        finally:
            self.post_message(StreamEnded())

    @on(StreamEvent)
    @_while_mounted
    def _on_stream_event(self, message: StreamEvent) -> None:
        ev = message.event
        self.metrics.observe(ev)
        self._panels_dirty = True
        if isinstance(ev, Step):
            self._main.query_one(AnswerView).add_step(ev)
            if not self.cancelling:
                self._phase = "streaming"
        elif isinstance(ev, PrefillDone) and not self.cancelling:
            self._phase = "prefill done"
        elif isinstance(ev, RequestStarted) and not self.cancelling:
            self._phase = "prefill…"
        elif isinstance(ev, Finished):
            self._record(ev)

    @on(StreamFailed)
    @_while_mounted
    def _on_stream_failed(self, message: StreamFailed) -> None:
        e = message.error
        if isinstance(e, Cancelled):  # an engine may raise instead of finishing "cancelled"
            self._phase = "cancelled"
            return
        self.errors.append(e)
        if message.details:
            self.log.error(message.details)
            self.notify(f"{type(e).__name__}: {e}", title="internal error", severity="error",
                        timeout=10)
        else:
            self.notify(str(e), title=_error_title(e), severity="error", timeout=10)
        self._phase = "error"

    @on(StreamEnded)
    @_while_mounted
    def _on_stream_ended(self) -> None:
        if self._phase not in ("error", "done", "cancelled"):
            self._phase = "ended"
        self._set_running(False)
        settings, chatted = self._settings, self._turn_user is not None
        self._turn_user = None
        if chatted and settings is not None and settings.promises_text and \
                hasattr(self.source, "settle") and self._phase in ("done", "cancelled"):
            # such a turn reuses only prefill-written KV: refresh the answer's while it is read
            self.settling = True
            self._phase += " · refreshing KV…"
            self._settle_stop = threading.Event()
            self._settle(settings, self._settle_stop)
        self._refresh_all()
        self.call_after_refresh(self._refresh_tick)  # anchors a long answer once laid out

    @work(thread=True, group="settle", exit_on_error=False)
    def _settle(self, settings: Settings, stop: threading.Event) -> None:
        try:
            self.post_message(Settled(stop, self.source.settle(settings, stop.is_set)))
        except Exception as e:  # the next turn then prefills the answer: say so, carry on
            self.post_message(Settled(stop, 0, e))

    @on(Settled)
    @_while_mounted
    def _on_settled(self, message: Settled) -> None:
        if message.stop is not self._settle_stop:
            return  # an earlier turn's refresh, stopped by the run that followed it
        self.settling = False
        if message.error is not None:
            self.notify(f"the KV refresh failed ({message.error}); the next turn prefills the "
                        "answer", title="conversation", severity="warning")
        if not self.running:
            done = f" · KV refreshed ({message.refreshed} tok)" if message.refreshed else ""
            self._phase = self._phase.replace(" · refreshing KV…", done)
            self._refresh_status()

    def _stop_settling(self) -> None:
        if self._settle_stop is not None:
            self._settle_stop.set()

    def _record(self, ev: Finished) -> None:
        s = ev.stats
        self.requests_done += 1
        if self._turn_user is not None:
            self.transcript.record(self._turn_user, ev)
        self._phase = "cancelled" if ev.stop_reason == "cancelled" else "done"
        settings = self._settings
        if settings is not None:
            self._plain_timing[settings.target] = self.metrics.plain_timing
        table = self._main.query_one("#history", DataTable)
        label = settings.how(ran=s.proposer) if settings else s.proposer
        table.add_row(*history_row(self.requests_done, label, s))
        while table.row_count > HISTORY_ROWS:
            table.remove_row(next(iter(table.rows)))
        table.move_cursor(row=table.row_count - 1)
        self._main.query_one("#answer-box").border_subtitle = summary_line(s)
        note = getattr(self.source, "idle_note", None)  # scripted sources have no engine
        why = note(s) if note is not None else None
        if why:
            self.notify(why, title="speculation", timeout=12)
        if ev.stop_reason == "context":
            self.notify(f"the context window filled after {s.generated_tokens} tokens; start "
                        "with a larger --n-ctx or a shorter prompt", title="context full",
                        severity="warning", timeout=10)

    def _set_running(self, running: bool) -> None:
        self.running = running
        if not running:
            self.cancelling = False
        self._main.query_one("#run", Button).disabled = running
        self._main.query_one("#cancel", Button).disabled = not running

    # --- drawing -------------------------------------------------------------------------
    @_while_mounted
    def _refresh_tick(self) -> None:
        self._draw()

    def _draw(self) -> None:
        self._main.query_one(AnswerView).flush()
        box = self._main.query_one("#answer-box")
        if not box._anchored and box.max_scroll_y > 0:
            # Anchored only once the answer overflows (an anchored box bottom-aligns short
            # text); from then on it follows the stream until the user scrolls up.
            box.anchor()
        if self._panels_dirty:
            self._refresh_panels()

    def _poll_memory(self) -> None:
        rss = self.memory_probe()
        if rss != self.rss:
            self.rss = rss
            self._panels_dirty = True

    def _refresh_all(self) -> None:
        self._draw()
        self._refresh_legend()
        self._refresh_panels()

    def palette(self) -> Palette:
        styles = self._main.query_one(AnswerView).origin_styles()
        return Palette(draft=styles[DRAFT], target=styles[TARGET])

    def _refresh_panels(self) -> None:
        self._panels_dirty = False
        m, p = self.metrics, self.palette()
        live = self._main.query_one("#live", Static)
        width = live.content_region.width or 28
        self._main.query_one("#spark", Static).update(
            spark_text(m.pass_acceptance, width=width, p=p))
        live.update(live_text(m, rss=self.rss, width=width, p=p))
        self._main.query_one("#hist", Static).update(
            histogram_text(m.stats.accepted_length_hist, width=width, p=p))
        self._main.query_one("#positions", Static).update(
            positions_text(m.stats.position_acceptance, m.stats.position_drafted, width=width,
                           p=p))
        self._refresh_status()

    def _refresh_status(self) -> None:
        try:
            label = (self._settings if self.running and self._settings
                     else self.current_settings()).label
        except EdgespecError:
            label = "(settings incomplete: F2)"
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("edgespec ", Style(bold=True))
        t.append(f"│ {label} │ ")
        t.append(self._phase, Style(bold=self.running))
        if self.transcript.turns:
            t.append(f" │ chat: {len(self.transcript)} turns")
        n = self.metrics.stats.generated_tokens
        if n:
            t.append(f" · {n} tok")
        last = self.metrics.controls[-1] if self.metrics.controls else None
        if last is not None:
            t.append(f" │ {control_words(last.kind, last.proposer, last.k)}", Style(dim=True))
        self._main.query_one("#status", Static).update(t)

    def _refresh_legend(self) -> None:
        answer = self._main.query_one(AnswerView)
        t = Text(no_wrap=True, overflow="ellipsis")
        if answer.colour:
            styles = answer.origin_styles()
            t.append("■ accepted draft", styles[DRAFT])
            t.append("  ")
            t.append("■ target's own", styles[TARGET])
            t.append("  (F3)", Style(dim=True))
        else:
            t.append("colouring off  F3 on", Style(dim=True))
        self._main.query_one("#legend", Static).update(t)

    async def on_unmount(self) -> None:
        self._stop_settling()
        if self.running:
            self.source.cancel()


def _number(text: str, kind: type, name: str, default):
    text = text.strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InvalidInputError(f"{name} must be {what} (got {text!r})") from None


def _error_title(e: BaseException) -> str:
    words = {"ModelError": "model", "IncompatibleDraftError": "incompatible draft",
             "ContextOverflowError": "context full", "UnsupportedError": "unsupported",
             "InvalidInputError": "invalid input", "Cancelled": "cancelled"}
    return words.get(type(e).__name__, "error")


def create_app(source: EventSource | None = None, **kw) -> EdgespecApp:
    """The one way the CLI and the tests build the app (default: the real engine)."""
    if source is None:
        source = EngineSource()
    return EdgespecApp(source, **kw)
