"""Compiled constraints kept under a byte budget, not a count.

A count bounds nothing when one entry can be large: 64 entries of a heavy schema's grammar
pinned gigabytes. Here each entry is weighed (its key, the text it holds) and the least
recently used go first until the total fits. Thread-safe: the server compiles constraints
on several worker threads.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: what the cache's bookkeeping costs per entry beyond the weighed objects (dict slot, tuple)
ENTRY_OVERHEAD = 200


def text_bytes(*texts: object) -> int:
    """Memory held by these strings (None: nothing), as CPython stores them."""
    return sum(sys.getsizeof(t) for t in texts if t is not None)


class ByteBudgetCache(Generic[K, V]):
    """An LRU mapping whose entries together weigh at most ``budget`` bytes.

    An entry heavier than the whole budget is not kept (it is computed again when asked
    for again). ``weigh(key, value)`` gives an entry's bytes.
    """

    def __init__(self, budget: int, weigh: Callable[[K, V], int]) -> None:
        self.budget = budget
        self._weigh = weigh
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: K, value: V) -> None:
        size = self._weigh(key, value) + ENTRY_OVERHEAD
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.budget:
                return
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.budget:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def get_or_make(self, key: K, make: Callable[[K], V]) -> V:
        """The cached value, or ``make(key)`` cached (its exceptions are not)."""
        hit = self.get(key)
        if hit is None:
            hit = make(key)
            self.put(key, hit)
        return hit
