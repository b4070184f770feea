"""Reading the user's messages in `edgespec chat`: line editing and input history on a
terminal, one message per line from a pipe.

On a terminal the standard library's ``readline`` gives input() line editing (arrows, Home/End,
Ctrl-R search) and a history that persists across runs in ``paths.sessions_dir()/input_history``
(written atomically with edgespec.statefile, the last :data:`HISTORY_LINES` lines). A message
spans several lines when a line ends with a backslash (the backslash is dropped and the next
line continues the message), or between ``/paste`` and a line ``/end``.

When stdin is not a terminal (tests, pipes) nothing of this is loaded: each line is read as it
comes, exactly as before, so a backslash at the end of a piped line stays part of it.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, TextIO

from .. import paths, statefile

HISTORY_FILE = "input_history"
HISTORY_LINES = 1000
PROMPT = "\n> "
CONTINUE = "… "
PASTE_END = "/end"


def history_path() -> Path:
    return paths.sessions_dir() / HISTORY_FILE


class LineReader:
    """``read()`` -> the next message (continuations joined), or None at end of input."""

    def __init__(self, interactive: bool, stream: TextIO | None = None,
                 history: Path | None = None,
                 ask: Callable[[str], str] | None = None) -> None:
        self.interactive = interactive
        self.stream = stream or sys.stdin
        self.history = history if history is not None else history_path()
        self._ask = ask or input
        self._readline = None
        if interactive:
            self._readline = _load_readline(self.history)

    def _line(self, prompt: str) -> str | None:
        try:
            if self.interactive:
                return self._ask(prompt)
            line = self.stream.readline()
            return line.rstrip("\n") if line else None
        except EOFError:
            return None

    def read(self) -> str | None:
        """A message: one line, or on a terminal lines joined while each ends with ``\\``."""
        line = self._line(PROMPT)
        if line is None or not self.interactive:
            return line
        parts = []
        while line is not None and line.endswith("\\"):
            parts.append(line[:-1])
            line = self._line(CONTINUE)
        parts.append(line or "")
        return "\n".join(parts)

    def paste(self) -> str | None:
        """Lines up to one that is exactly ``/end`` (or end of input), joined by newlines."""
        lines = []
        while True:
            line = self._line(CONTINUE if self.interactive else "")
            if line is None or line.strip() == PASTE_END:
                break
            lines.append(line)
        return "\n".join(lines)

    def save_history(self) -> None:
        """Keep the last lines typed for the next run; a failed write costs only history."""
        rl = self._readline
        if rl is None:
            return
        n = rl.get_current_history_length()
        items = [rl.get_history_item(i) for i in range(max(1, n - HISTORY_LINES + 1), n + 1)]
        text = "".join(f"{s}\n" for s in items if s and "\n" not in s)
        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            statefile.atomic_write(self.history, [text.encode("utf-8")], what="input history")
        except (OSError, statefile.StateFileError):  # a full disk: the chat itself is saved apart
            pass


def _load_readline(history: Path):  # type: ignore[no-untyped-def]
    try:
        # deferred: imported only on a terminal; importing readline alone turns on input()'s
        # line editing, and some platforms (Windows) have none
        import readline
    except ImportError:
        return None
    readline.set_history_length(HISTORY_LINES)
    readline.clear_history()
    try:
        readline.read_history_file(str(history))
    except OSError:  # no history yet (or unreadable): start empty
        pass
    return readline
