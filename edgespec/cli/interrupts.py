"""Ctrl-C for commands that run llama.cpp: the first one stops the work cleanly, a second
one ends the process at once without tearing anything down.

Python turns SIGINT into a KeyboardInterrupt at whatever line runs next. Raised while
llama.cpp objects are being freed (the first interrupt's unwinding, an engine's close) it
left some of them freed twice; a second Ctrl-C 50 ms after the first crashed
`edgespec generate` (SIGSEGV, glibc's "double free") in most tries. So while a command
holds native objects:

* the first SIGINT runs the command's cancel action (``Engine.cancel``: the request ends
  at its next step with stop_reason "cancelled", and the command unwinds normally);
* any later SIGINT, and a first one before there is anything to cancel (the model still
  loading: llama.cpp's load cannot be stopped midway, and a KeyboardInterrupt raised in
  its log callback is swallowed by ctypes), writes "interrupted" and ``os._exit(130)``s:
  no destructor, finalizer or atexit handler runs, so nothing native is freed while a
  decode may be running on another thread, and the exit is immediate even mid-pass
  (edgespec's caches are written to a temporary file and renamed, so none is left torn).

:func:`in_thread` runs the request's event stream on a worker thread, so the main thread
(the only one Python runs signal handlers on) waits on a queue and takes a Ctrl-C at once
rather than after a long native call (a prompt's prefill) returns.
"""
from __future__ import annotations

import os
import queue
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd command


class Interrupts:
    """The SIGINT state of one command (see the module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        self._cancel: Callable[[], None] | None = None

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def on_first(self, cancel: Callable[[], None]) -> None:
        """From now on the first SIGINT calls ``cancel`` (thread-safe, must not block)."""
        self._cancel = cancel
        if self.count:  # it came before there was anything to cancel
            cancel()

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.count += 1
        if self.count > 1 or self._cancel is None:
            exit_now()
        self._cancel()


def exit_now(code: int = EXIT_INTERRUPTED) -> None:
    """End the process at once: what was printed stays printed, nothing is torn down."""
    try:
        sys.stdout.flush()  # the text generated so far; may be mid-write on this thread
    except Exception:
        pass
    try:
        os.write(2, b"\ninterrupted\n")
    except OSError:
        pass
    os._exit(code)


@contextmanager
def interrupts() -> Iterator[Interrupts]:
    """Install the handler for the block (main thread only; elsewhere a no-op state).

    Once an interrupt has been seen, SIGINT is ignored after the block: the command has
    unwound and the process is exiting, and CPython resets a Python-level handler to the
    default during shutdown, where a second Ctrl-C would kill it mid-finalization."""
    state = Interrupts()
    try:
        previous = signal.signal(signal.SIGINT, state._handle)
    except ValueError:  # not the main thread (an embedding app): leave its signals alone
        yield state
        return
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN if state.interrupted else previous)


def in_thread(events: Iterable, stop: Callable[[], None]) -> Iterator:
    """Iterate ``events`` on a worker thread and yield them on this one; the producer's
    exception is raised here. If this generator is left early, ``stop()`` ends the
    producer (``Engine.cancel``) and the worker is joined before it returns, so the engine
    is idle when the caller closes it."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    end = object()

    def run() -> None:
        try:
            for ev in events:
                q.put((ev, None))
        except BaseException as e:  # handed to the consumer, raised there
            q.put((end, e))
        else:
            q.put((end, None))

    worker = threading.Thread(target=run, name="edgespec-request", daemon=True)
    worker.start()
    try:
        while True:
            ev, err = q.get()  # interruptible: a SIGINT handler runs while this waits
            if ev is end:
                if err is not None:
                    raise err
                return
            yield ev
    finally:
        if worker.is_alive():
            stop()
            worker.join()
