"""Token bytes -> visible text, with stop strings that never leak.

Tokens arrive one at a time; a multi-byte character may span tokens, and a
stop string may span tokens or draft boundaries. Text that could still turn
out to be the start of a stop string is held back until it cannot.
"""
from __future__ import annotations

import codecs
from typing import Sequence


class TextAssembler:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self._max_stop = max((len(s) for s in self.stops), default=0)
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # everything decoded so far (cut at a stop string once found)
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return newly visible text (may be empty)."""
        if self.stopped:
            return ""
        self.text += self._dec.decode(piece)
        if self.stops:
            # A new match can only end inside the text added since the last call,
            # so search from just before the first unseen character.
            start = max(0, self.emitted - self._max_stop + 1)
            cut = min((i for i in (self.text.find(s, start) for s in self.stops) if i >= 0),
                      default=-1)
            if cut >= 0:
                self.stopped = True
                self.text = self.text[:cut]
                return self._take(cut)
            return self._take(len(self.text) - self._held_back())
        return self._take(len(self.text))

    def flush(self) -> str:
        """End of generation: release held-back text (it never became a stop)."""
        if self.stopped:
            return ""
        self.text += self._dec.decode(b"", final=True)
        return self._take(len(self.text))

    def _held_back(self) -> int:
        tail = self.text[-self._max_stop:] if self._max_stop else ""
        for n in range(min(len(tail), self._max_stop - 1), 0, -1):
            suffix = tail[-n:]
            if any(s.startswith(suffix) for s in self.stops):
                return n
        return 0

    def _take(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted:upto]
        self.emitted = upto
        return out
