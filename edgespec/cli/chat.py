"""`edgespec chat`: a multi-turn conversation in the terminal over edgespec.chat.conversation.

Each turn reuses the KV cache of the conversation so far and prefills only the new
message. Commands: /help, /stats, /reset, /save NAME, /load NAME, /system TEXT, /paste, /quit.
Ctrl-C cancels the current turn, not the conversation. On a terminal, input has line editing
and a history kept across runs (edgespec.chat.lineinput); a line ending in a backslash
continues the message on the next line, and /paste takes every line up to /end. When stdin
is not a terminal, each line is one user message (or command); with --json each turn prints
one record, otherwise each answer is followed by a one-line stats footer on stderr.

Every turn is saved (atomically, edgespec.chat.sessions) under the conversation's name: the
one given to --resume, else chat-DATE-TIME; `chat --list` lists them, `chat --resume` picks
the most recent up again. --no-save keeps nothing.

A greedy or seeded chat (and --exact) reuses only KV a prefill wrote, so that a turn gives
the text it would give alone: the answer's KV is prefilled again after each turn
(Conversation.settle) and the next turn reuses it, in a terminal while you type (your next
message stops it), from a pipe before the next line is read.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import warnings
from contextlib import contextmanager

import click

from .common import handle_errors
from .options import engine_options, finite, structured_options, structured_params
from ..errors import EdgespecError
from ..statefile import StateFileError
from ..api.params import GenerationParams, SamplingParams
from ..api.events import Step
from ..chat.footer import footer

HELP = "commands: /help  /stats  /reset  /save NAME  /load NAME  /system TEXT  /paste  /quit"
HELP_LONG = f"""{HELP}
  a line ending in \\ continues the message on the next line; /paste reads lines up to /end
  Up/Down recall earlier input (kept across runs), Ctrl-R searches it; Ctrl-C stops an answer
  each turn is saved: edgespec chat --list shows the conversations, --resume [NAME] goes on"""


@click.command("chat")
@engine_options
@click.option("--max-tokens", type=click.IntRange(1), default=512, show_default=True,
              help="Most tokens per answer.")
@click.option("--temperature", type=finite(0.0), default=0.0, show_default=True,
              help="0 = greedy.")
@click.option("--seed", type=int, default=None)
@click.option("--system", default=None, help="System message.")
@click.option("--resume", "--session", "resume", is_flag=False, flag_value="", default=None,
              metavar="[NAME]", help="Go on with a saved conversation (the most recent "
              "without NAME); later turns are saved under its name.")
@click.option("--list", "list_sessions", is_flag=True,
              help="List the saved conversations, most recent first, and exit.")
@click.option("--no-save", is_flag=True, help="Do not save the conversation after each turn.")
@click.option("--kv-cache-mib", type=click.IntRange(0), default=256, show_default=True,
              help="RAM for the KV states of earlier conversations (0: keep only the current).")
@structured_options
@click.option("--json", "as_json", is_flag=True, help="One JSON record per turn on stdout.")
@handle_errors
def chat(flags, max_tokens, temperature, seed, system, resume, list_sessions, no_save, kv_cache_mib, grammar_file,
         schema_file, json_mode, as_json):
    """Chat with a model; the conversation's KV cache is reused from turn to turn."""
    # deferred: `edgespec` starts without what other commands need
    from ..chat import sessions
    from ..chat.conversation import Conversation
    from ..chat.lineinput import LineReader
    from ..engine.engine import Engine  # deferred: it loads llama.cpp

    if list_sessions:
        _list(sessions.describe(), as_json)
        return
    if resume == "":
        resume = sessions.latest()
        if resume is None:
            raise click.UsageError(f"no saved conversation to resume (in {sessions.session_path('x').parent})")
    elif resume is not None:
        sessions.session_path(resume)  # a bad name is refused before the model loads

    params = GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(
        temperature=temperature, seed=seed),
        **structured_params(grammar_file, schema_file, json_mode)).validate()
    engine = Engine.from_config(flags.config().with_(
        kv_cache_ram=kv_cache_mib << 20))
    try:
        ui = _Ui(as_json)
        _clean_sessions()
        conv = Conversation(engine, system=system, params=params)
        if resume:
            conv = _load(engine, conv, resume, ui)
        interactive = sys.stdin.isatty()
        reader = LineReader(interactive)
        saver = _AutoSave(engine, ui, None if no_save else (resume or sessions.auto_name()))
        if interactive:
            ui.note(f"{engine.target_name} · proposer {engine.default_proposer} · {HELP}")
            if saver.name:
                ui.note(f"saving as {saver.name} (edgespec chat --resume {saver.name})")
        settle = None  # the conversation whose last turn still has idle-time work
        try:
            while True:
                with _settling(settle, background=interactive, ui=ui):
                    line = reader.read()
                settle = None
                if line is None:
                    break
                if line.strip() == "/paste":
                    line = reader.paste()
                elif line.strip().startswith("/"):
                    conv = _command(line.strip(), conv, engine, ui, saver)
                    if conv is None:
                        break
                    continue
                if not line or not line.strip():
                    continue
                try:
                    _turn(conv, line.strip(), engine, ui)
                    settle = conv
                except EdgespecError as e:  # a refused message ends the turn, not the chat
                    ui.error(str(e))
                    continue
                saver.save(conv)
        finally:
            reader.save_history()
    finally:
        engine.close()


def _list(listed, as_json: bool) -> None:
    """`chat --list`: name, when, turns, the first message (one line each)."""
    import time  # deferred: only --list formats dates
    if as_json:
        for s in listed:
            click.echo(json.dumps({"name": s.name, "modified": s.modified, "turns": s.turns,
                                   "first": s.first, "model_sha256": s.model}))
        return
    if not listed:
        click.echo("no saved conversations", err=True)
        return
    for s in listed:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.modified))
        first = s.first if len(s.first) <= 60 else s.first[:59] + "…"
        click.echo(f"{s.name:<24} {when}  {s.turns:>3} turn{'s' if s.turns != 1 else ' '}  {first}")


class _AutoSave:
    """Saves the conversation after each turn under ``name`` (None: --no-save)."""

    def __init__(self, engine, ui: "_Ui", name: str | None) -> None:
        self.engine, self.ui, self.name = engine, ui, name
        self._failed = False

    def save(self, conv) -> None:
        from ..chat import sessions  # deferred: `edgespec` starts without what other commands need
        if self.name is None or not conv.messages:
            return
        try:
            _with_warnings(self.ui, sessions.save, self.engine, conv, self.name)
            self._failed = False
        except StateFileError as e:  # a full disk: the chat goes on; said once, not per turn
            if not self._failed:
                self.ui.error(f"warning: saving the conversation failed ({e}); it goes on in "
                              "memory and is saved again after the next turn")
            self._failed = True

    def rename(self, name: str, fresh: bool = False) -> None:
        """Later turns go to ``name``. A ``fresh`` (automatic) name already taken, e.g. by a
        /reset within the same second, gets a suffix: no conversation overwrites another."""
        from ..chat import sessions  # deferred: `edgespec` starts without what other commands need
        if self.name is None:
            return
        base, n = name, 1
        while fresh and (name == self.name or sessions.session_path(name).exists()):
            n += 1
            name = f"{base}-{n}"
        self.name = name


def _clean_sessions() -> None:
    """Remove the temporary files of /save runs that were killed (a full disk, kill -9)."""
    from ..chat import sessions  # deferred: `edgespec` starts without what other commands need
    sessions.clean()


@contextmanager
def _settling(conv, background: bool, ui: "_Ui"):
    """The idle-time work of the last turn (Conversation.settle: exact mode's KV refresh),
    while the next message is read: on a thread that the message stops between chunks, or
    (stdin not a terminal, the message already waiting) before reading it."""
    if conv is None:
        yield
        return
    if not background:
        _settle(conv, None, ui)
        yield
        return
    stop = threading.Event()
    worker = threading.Thread(target=_settle, args=(conv, stop.is_set, ui),
                              name="edgespec-kv-refresh", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()


def _settle(conv, stop, ui: "_Ui") -> None:
    try:
        conv.settle(stop)
    except EdgespecError as e:  # the next turn prefills what the refresh could not
        ui.error(f"warning: the KV refresh failed ({e}); the next turn prefills the answer")


@contextmanager
def _ctrl_c_cancels(engine):
    """While a turn runs, Ctrl-C cancels it; at the prompt it ends the chat as usual."""
    try:
        old = signal.signal(signal.SIGINT, lambda *_: engine.cancel())
    except ValueError:  # not the main thread: no handler to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _turn(conv, text: str, engine, ui: "_Ui") -> None:

    with _ctrl_c_cancels(engine):
        for ev in conv.send(text):
            if isinstance(ev, Step) and ev.text and not ui.as_json:
                click.echo(ev.text, nl=False)
                sys.stdout.flush()
    turn = conv.turns[-1]
    s = turn.stats
    if ui.as_json:
        click.echo(json.dumps({
            "turn": len(conv.turns), "text": turn.text, "stop_reason": turn.stop_reason,
            "prompt_tokens": s.prompt_tokens, "prompt_reused": s.prompt_reused,
            "prompt_computed": s.prompt_computed, "ttft_seconds": s.ttft_seconds,
            "generated_tokens": s.generated_tokens,
            "decode_tokens_per_second": s.decode_tokens_per_second,
            "acceptance_rate": s.acceptance_rate, "proposer": s.proposer}))
    else:
        click.echo()
        if turn.stop_reason == "cancelled":
            ui.note("(cancelled)")
        ui.note(footer(s, _plain_step_seconds(engine)))


def _plain_step_seconds(engine) -> float | None:
    """The 1-token pass time the engine's calibration measured on this machine, for the
    footer's "× plain"; None when no calibration is loaded or it is the CPU prior (a speedup
    against a prior would be a guess). Engine.calibration() is not called: on an engine
    without adaptive control it would start a measurement. The attribute is read as the
    engine keeps it (it loads it with the first adaptive request)."""
    cal = getattr(engine, "_calibration", None)
    return cal.step_seconds if cal is not None and getattr(cal, "source", "") == "measured" else None


def _command(line: str, conv, engine, ui: "_Ui", saver: _AutoSave | None = None):
    from ..chat import sessions  # deferred: `edgespec` starts without what other commands need

    cmd, _, arg = line.partition(" ")
    arg = arg.strip()
    try:
        if cmd in ("/quit", "/exit"):
            return None
        if cmd == "/stats":
            if not conv.turns:
                ui.result(cmd, "no turn yet")
            elif ui.as_json:
                ui.result(cmd, conv.turns[-1].stats.to_dict())
            else:
                ui.note(conv.turns[-1].stats.summary())
        elif cmd == "/help":
            ui.result(cmd, HELP_LONG)
        elif cmd == "/reset":
            conv.reset()
            if saver is not None:  # the cleared conversation keeps its file; a new one starts
                saver.rename(sessions.auto_name(), fresh=True)
            ui.result(cmd, "conversation cleared")
        elif cmd == "/system":
            conv.set_system(arg or None)
            ui.result(cmd, f"system message {'set' if arg else 'cleared'}")
        elif cmd == "/save":
            try:
                path = _with_warnings(ui, sessions.save, engine, conv, arg)
            except StateFileError as e:  # a full disk: the chat goes on, nothing is lost
                ui.error(f"the save failed: {e}; the conversation is kept in memory, /save "
                         "again once there is space")
            else:
                ui.result(cmd, str(path))
        elif cmd == "/load":
            conv = _load(engine, conv, arg, ui)
            if saver is not None:
                saver.rename(arg)
        else:
            ui.error(f"unknown command {cmd}; {HELP}")
    except EdgespecError as e:
        ui.error(str(e))
    return conv


def _load(engine, conv, name: str, ui: "_Ui"):
    from ..chat import sessions  # deferred: `edgespec` starts without what other commands need

    new, got = _with_warnings(ui, sessions.load_conversation, engine, name, params=conv.params,
                              proposer=conv.proposer)
    ui.result("/load", f"{name}: {len(got.messages)} messages, {got.restored} tokens of KV "
                       "state restored")
    return new


def _with_warnings(ui, fn, *args, **kw):
    """Run ``fn``, showing each session warning it emits as an error line. "always" is set
    for SessionWarning only: CPython (3.11) keeps the filter list a warning was last
    checked against for interpreter shutdown, so an "always" for every category here made
    the exit report llama-cpp-python's two lifelong /dev/null files as ResourceWarnings."""
    from ..chat.sessions import SessionWarning  # deferred: `edgespec` starts without what other commands need

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SessionWarning)
        out = fn(*args, **kw)
    for w in caught:
        ui.error(f"warning: {w.message}")
    return out


class _Ui:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def note(self, text: str) -> None:
        click.echo(text, err=True)

    def error(self, text: str) -> None:
        click.echo(text, err=True)

    def result(self, cmd: str, value) -> None:
        if self.as_json:
            click.echo(json.dumps({"command": cmd, "result": value}))
        else:
            click.echo(value if isinstance(value, str) else json.dumps(value), err=True)
