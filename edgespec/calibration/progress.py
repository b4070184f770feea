"""Progress of the measurements a first run makes, for the person waiting on them.

The first time a model runs on a machine, the default mode measures it (the kernel
candidates, the verify-cost curve, the exactness probe); the results are cached, so later
runs start at once. Those loops report through :func:`task`. A front end installs a
:class:`Reporter` with :func:`set_reporter` (the CLI draws one line on a terminal and
prints one note otherwise); with none installed nothing is reported.

    with progress.task("timing verify passes", total=60) as t:
        for ...:
            ...
            t.advance()
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator, Protocol


class Reporter(Protocol):
    """Where progress goes. ``update`` is called at most a few times a second; ``cached``
    says whether what is measured is kept for later runs (a first run's calibration) or
    measured for this run only (a bench's ``--record`` curves)."""

    def begin(self, what: str, total: int, cached: bool = True) -> None: ...

    def update(self, what: str, done: int, total: int, elapsed: float) -> None: ...

    def end(self, what: str, elapsed: float) -> None: ...


_lock = threading.Lock()
_reporter: Reporter | None = None

#: seconds between two updates of one task: a terminal line redrawn faster only flickers
UPDATE_INTERVAL = 0.25


def set_reporter(reporter: Reporter | None) -> Reporter | None:
    """Install ``reporter`` for the whole process; returns the one it replaces."""
    global _reporter
    with _lock:
        old, _reporter = _reporter, reporter
    return old


class Task:
    """One measurement in progress: ``advance`` after each unit of work."""

    def __init__(self, what: str, total: int, reporter: Reporter | None) -> None:
        self.what, self.total, self.done = what, max(1, int(total)), 0
        self._reporter = reporter
        self._t0 = time.monotonic()
        self._last = 0.0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def advance(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if self._reporter is None:
            return
        now = time.monotonic()
        if now - self._last >= UPDATE_INTERVAL or self.done == self.total:
            self._last = now
            self._reporter.update(self.what, self.done, self.total, now - self._t0)


@contextmanager
def task(what: str, total: int, cached: bool = True) -> Iterator[Task]:
    """A measurement of ``total`` units named ``what`` (the reporter's begin/end around it;
    the end is reported whether it completed or failed); ``cached=False`` for one measured
    for this run only."""
    reporter = _reporter
    t = Task(what, total, reporter)
    if reporter is not None:
        reporter.begin(what, t.total, cached)
    try:
        yield t
    finally:
        if reporter is not None:
            reporter.end(what, t.elapsed)


def eta(done: int, total: int, elapsed: float) -> float | None:
    """Seconds left at the rate so far, or None before there is a rate."""
    if done <= 0 or elapsed <= 0:
        return None
    return elapsed / done * max(0, total - done)
