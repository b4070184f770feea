"""The server's open connections, bounded in total and per client address.

One client that opens thousands of idle sockets must not lock every other client out (nor
exhaust the process's file descriptors, after which nobody can connect and the accept loop
logs an error per attempt). Each accepted connection is admitted here before it is served:

- under both caps: admitted;
- over a cap: the oldest *idle* connection in the way is closed (idle: no request in
  progress, only waiting for the next request's headers; its client loses nothing, HTTP
  clients reconnect a closed keep-alive connection), over the per-client cap one of that
  client's own, over the total cap anyone's;
- none idle (every connection is busy with a request): the new one is refused (503).

So the idle sockets a flood holds are recycled by the next connections, and a client with
a request in flight keeps it. :class:`Connections` knows nothing of HTTP or asyncio: a
connection is anything with ``idle()`` and ``close()`` (run.py's protocol), which keeps it
testable with plain objects.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from ..errors import InvalidInputError


class Connection(Protocol):
    def idle(self) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ConnectionLimits:
    total: int = 256
    per_client: int | None = None  # None: half of total (at least 1)

    def validate(self) -> "ConnectionLimits":
        if self.total < 1:
            raise InvalidInputError(f"--max-connections must be >= 1 (got {self.total})")
        if self.per_client is not None and self.per_client < 1:
            raise InvalidInputError(f"--max-connections-per-client must be >= 1 (got "
                                    f"{self.per_client})")
        return self

    @property
    def client_cap(self) -> int:
        return min(self.total, self.per_client if self.per_client is not None
                   else max(1, self.total // 2))


class Connections:
    """Open connections by client address, oldest first (single-threaded: the event loop's)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits.validate()
        self._all: OrderedDict[Connection, str] = OrderedDict()
        self._by_client: dict[str, OrderedDict[Connection, None]] = {}
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # connections refused: every one in the way was busy

    def __len__(self) -> int:
        return len(self._all)

    def of(self, client: str) -> int:
        return len(self._by_client.get(client, ()))

    def admit(self, conn: Connection, client: str) -> bool:
        """Register ``conn``; False (nothing registered) when it must be refused."""
        mine = self._by_client.get(client)
        if mine is not None and len(mine) >= self.limits.client_cap \
                and not self._evict(mine.keys()):
            self.refused += 1
            return False
        if len(self._all) >= self.limits.total and not self._evict(self._all.keys()):
            self.refused += 1
            return False
        self._all[conn] = client
        self._by_client.setdefault(client, OrderedDict())[conn] = None
        return True

    def active(self, conn: Connection) -> None:
        """``conn`` finished a response: it becomes the newest (the last one evicted)."""
        if conn in self._all:
            self._all.move_to_end(conn)
            self._by_client[self._all[conn]].move_to_end(conn)

    def release(self, conn: Connection) -> None:
        client = self._all.pop(conn, None)
        if client is None:
            return
        mine = self._by_client[client]
        mine.pop(conn, None)
        if not mine:
            del self._by_client[client]

    def _evict(self, candidates: Iterable[Connection]) -> bool:
        """Close the oldest idle connection among ``candidates``; False if all are busy."""
        for c in list(candidates):
            if c.idle():
                self.release(c)
                c.close()
                self.evicted += 1
                return True
        return False


class Throttled:
    """Say a recurring problem once per ``interval`` seconds, with how often it recurred
    meanwhile (an accept loop out of file descriptors fails on every attempt)."""

    def __init__(self, say: Callable[[str], None], interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.say = say
        self.interval = interval
        self.clock = clock
        self._last: float | None = None
        self._quiet = 0

    def __call__(self, message: str) -> None:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            self._quiet += 1
            return
        more = f" ({self._quiet} more since the last report)" if self._quiet else ""
        self.say(f"{message}{more}; said at most once every {self.interval:g} s")
        self._last, self._quiet = now, 0
