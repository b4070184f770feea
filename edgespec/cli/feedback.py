"""What the command line shows while it works: edgespec's warnings as one ``edgespec:``
line each (never Python's source line under them), and the first run's measurements as a
progress line on a terminal or one note per measurement otherwise.

Installed once by the ``edgespec`` group (:func:`install`); the library itself prints
nothing and only reports (``warnings``, :mod:`edgespec.calibration.progress`).
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import TextIO

from ..calibration import progress

_PACKAGE = str(Path(__file__).resolve().parent.parent)


def install(stream: TextIO | None = None) -> None:
    """One-line warnings for edgespec's own, and a progress reporter on ``stream``
    (standard error by default)."""
    out = stream if stream is not None else sys.stderr
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not str(filename).startswith(_PACKAGE):
            return default(message, category, filename, lineno, file, line)
        print(f"edgespec: {message}", file=file or out, flush=True)

    warnings.showwarning = show
    progress.set_reporter(Progress(out))


class Progress:
    """:class:`edgespec.calibration.progress.Reporter` for a terminal (one redrawn line:
    what is measured, how far, how long is left) or a pipe (one note when it starts, so a
    log shows why the first run took longer)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.first = True

    def begin(self, what: str, total: int, cached: bool = True) -> None:
        if self.first and cached:
            # a first run, or a cache this build or machine no longer matches: both wait
            self._line("measuring this model on this machine once (cached afterwards)",
                       end="\n")
            self.first = False
        if not self.tty:
            self._line(f"{what}...", end="\n")
        else:
            self._line(f"{what}...")

    def update(self, what: str, done: int, total: int, elapsed: float) -> None:
        if not self.tty:
            return
        left = progress.eta(done, total, elapsed)
        tail = f", ~{left:.0f} s left" if left is not None and done < total else ""
        self._line(f"{what}: {done * 100 // max(total, 1)}% ({elapsed:.0f} s{tail})")

    def end(self, what: str, elapsed: float) -> None:
        if self.tty:
            self._line(f"{what}: done in {elapsed:.1f} s", end="\n")

    def _line(self, text: str, end: str = "") -> None:
        try:
            if self.tty:
                self.out.write(f"\r\x1b[Kedgespec: {text}{end}")
            else:
                self.out.write(f"edgespec: {text}{end}")
            self.out.flush()
        except (OSError, ValueError):  # a closed pipe must not break the measurement
            pass
