"""Recent Responses-API answers, kept in memory for ``previous_response_id`` and
``GET /v1/responses/{id}``: bounded in number (least recently stored dropped first), lost
on restart, as llama-server and ollama keep theirs."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the response object as answered
    # OpenAI-shaped messages up to and including its output
    conversation: tuple[dict[str, Any], ...]
    # (instructions excluded: a follow-up's own instructions replace them, as OpenAI's do)


class ResponseStore:
    def __init__(self, limit: int = 256) -> None:
        if limit < 1:
            raise ValueError(f"a response store holds at least one response (got {limit})")
        self.limit = limit
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: Stored) -> None:
        with self._lock:
            self._items[response_id] = stored
            self._items.move_to_end(response_id)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
