"""The scheduler: requests from many clients, one engine, one thread that owns the context.

    submit(prompt, params, on_event)   validates at once (an EdgespecError is the client's
                                       fault: a 400), queues the request (QueueFullError
                                       when the queue is full: a 429)
    the scheduler thread               runs queued requests and calls on_event(event) for
                                       each engine event, then on_event(DONE); or
                                       on_event(exc) once if the request failed
    ticket.cancel()                    a queued request is dropped, a running one ends at
                                       its next step with stop_reason "cancelled"
    close(drain=True)                  refuses new requests, finishes the admitted ones

``on_event`` runs on the scheduler thread: it must not block (the server hands events to
its asyncio loop with ``call_soon_threadsafe``).
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import EdgespecError
from ..params import GenerationParams

#: what on_event receives after a request's last event
DONE = None


class QueueFullError(EdgespecError):
    """The scheduler's queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDownError(EdgespecError):
    """The scheduler is draining and admits no new requests."""


@dataclass(frozen=True)
class Load:
    queued: int
    running: int
    slots: int
    max_queue: int


class Ticket:
    """A submitted request: its id, and the handle to cancel it from any thread."""

    def __init__(self, id: int, on_event: Callable[[object], None], scheduler: "Scheduler") -> None:
        self.id = id
        self.on_event = on_event
        self._scheduler = scheduler
        self.cancelled = threading.Event()
        self.submitted = time.monotonic()
        self.work = None  # what the scheduler runs

    def cancel(self) -> None:
        self.cancelled.set()
        self._scheduler._cancelled(self)


class Scheduler:
    """Runs requests on one engine from a single thread."""

    def __init__(self, engine, *, parallel: int = 1, max_queue: int = 16) -> None:
        if parallel < 1:
            raise EdgespecError(f"--parallel must be at least 1 (got {parallel})")
        if max_queue < 0:
            raise EdgespecError(f"the queue length must be >= 0 (got {max_queue})")
        self.engine = engine
        self.parallel = parallel
        self.max_queue = max_queue
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._queue: deque[Ticket] = deque()
        self._running: list[Ticket] = []
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="edgespec-scheduler", daemon=True)
        self._thread.start()

    # --- clients -------------------------------------------------------------------------
    def submit(self, prompt: str | Sequence[dict], params: GenerationParams, *,
               on_event: Callable[[object], None], proposer: str | None = None,
               exact: bool | None = None, reuse: bool = True) -> Ticket:
        with self._lock:
            if self._closing:
                raise ShuttingDownError("the server is shutting down; retry on another instance")
            if len(self._queue) >= self.max_queue + max(0, self.parallel - len(self._running)):
                raise QueueFullError(f"{len(self._queue)} requests are queued (limit "
                                     f"{self.max_queue}); retry shortly", self._retry_after())
        # validation and tokenization happen here, on the caller's thread: a bad request
        # is refused before it takes a place in the queue
        ticket = Ticket(next(self._ids), on_event, self)
        ticket.work = self.engine.stream(prompt, params, proposer=proposer, exact=exact,
                                         reuse=reuse)
        with self._lock:
            self._queue.append(ticket)
            self._wake.notify()
        return ticket

    def load(self) -> Load:
        with self._lock:
            return Load(len(self._queue), len(self._running), self.parallel, self.max_queue)

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            self._closing = True
            dropped = [] if drain else list(self._queue)
            if not drain:
                self._queue.clear()
                for t in self._running:
                    t.cancelled.set()
            self._wake.notify()
        for t in dropped:
            t.on_event(ShuttingDownError("the server shut down before this request ran"))
        if not drain:
            self.engine.cancel()
        self._thread.join(timeout)

    # --- the scheduler thread ------------------------------------------------------------
    def _cancelled(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket in self._queue:
                self._queue.remove(ticket)
                queued = True
            else:
                queued = False
                if ticket in self._running:
                    self.engine.cancel()
        if queued:
            ticket.on_event(DONE)

    def _retry_after(self) -> float:
        return 1.0

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return
                ticket = self._queue.popleft()
                self._running.append(ticket)
            try:
                for ev in ticket.work:
                    ticket.on_event(ev)
                ticket.on_event(DONE)
            except EdgespecError as e:
                ticket.on_event(e)
            except Exception as e:  # a bug: the client gets a 500, the server keeps serving
                ticket.on_event(e)
            finally:
                with self._lock:
                    self._running.remove(ticket)
