"""What a client of the scheduler holds: a ticket per request (its cancel handle), the
tickets of an n-choice request, the queue's load, and the scheduler's refusals."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Union

from ..api.events import Event
from ..errors import EdgespecError

if TYPE_CHECKING:
    from ..engine.engine import Prepared

#: what on_event receives after a request's last event
DONE = None

#: what a ticket's on_event receives: an event, the error that ended the request (its last
#: word then), or DONE
Delivery = Union[Event, BaseException, None]


class QueueFullError(EdgespecError):
    """The scheduler's queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDownError(EdgespecError):
    """The scheduler is draining and admits no new requests."""


@dataclass(frozen=True)
class QueueLoad:
    """How full the queue and the sequences are: what /health, /metrics and a 429 report
    (not a step's shared rows, which are edgespec.loop.state.Load)."""

    queued: int
    running: int
    slots: int
    max_queue: int


class Ticket:
    """A submitted request: its id, and the handle to cancel it from any thread.

    ``on_cancel`` is what the scheduler does when a ticket is cancelled (take it off the
    queue if it is still there): a callback, so that tickets need not know the scheduler
    and the import runs one way, scheduler -> tickets."""

    def __init__(self, id: int, on_event: Callable[[Delivery], None],
                 on_cancel: Callable[[Ticket], None], prepared: Prepared) -> None:
        self.id = id
        self.on_event = on_event
        self._on_cancel = on_cancel
        self.cancelled = threading.Event()
        self.submitted = time.monotonic()
        self.prepared = prepared
        # the other choices of an n > 1 request (submit_n): they are admitted with this
        # ticket, which alone sits in the queue, and start from the prompt KV it prefills
        self.followers: list[Ticket] = []
        self.leader: Ticket | None = None

    def cancel(self) -> None:
        self.cancelled.set()
        self._on_cancel(self)


class Choices:
    """The tickets of an n-choice request (:meth:`Scheduler.submit_n`), choice i at [i]."""

    def __init__(self, tickets: list[Ticket]) -> None:
        self.tickets = tickets

    def __len__(self) -> int:
        return len(self.tickets)

    def __getitem__(self, i: int) -> Ticket:
        return self.tickets[i]

    def cancel(self) -> None:
        for t in reversed(self.tickets):  # the leader last: a queued group leaves at once
            t.cancel()
