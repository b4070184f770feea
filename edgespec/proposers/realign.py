"""Copy tracking with re-entry after an edit (the "realign" proposer).

An edit of a text the request holds (rename a variable, add type hints, fix one line) is
a copy of that text with changes. The suffix tree and the n-gram statistics draft a copy
well while the context's tail matches it, but an edit breaks the match: right after the
model writes ``matches`` where the source says ``result``, the tail ``... matches`` occurs
nowhere, and they draft nothing for the few steps it takes a new tail to match again.

This proposer follows one *source*: the earlier occurrence the output is copying.

* in sync: it drafts what follows the source position, and moves along as the output
  matches it (its match length is how long the copy has run);
* at a mismatch it keeps the source position where the copy broke (the *anchor*) and,
  for the next ``substitution`` tokens, drafts the source as if the edit replaced as many
  tokens as it has written so far (``result`` → ``matches``: one for one). These drafts
  carry match length 1, so the controller's acceptance model prices them apart from
  in-sync ones and learns per request whether edits here are substitutions;
* it re-enters the copy when the output writes the anchor's token again (an insertion
  ended) or its last two tokens occur within ``window`` tokens after the anchor (a longer
  replacement or a deletion ended);
* otherwise, and with no source at all, it looks up the output's last ``min_match``
  tokens in the request's text (the latest occurrence) and follows that.

Pure Python on a token list and a dict of n-gram positions: microseconds per step.
"""
from __future__ import annotations

from typing import Sequence

from ..api.params import SamplingParams
from ..runtime.native import MAX_DRAFT
from .checks import check_int
from .base import EMPTY_DRAFT, Draft


class RealignProposer:
    """Knobs: ``min_match`` (tokens of the tail that must match to start following a
    source anywhere), ``window`` (how far past the anchor re-entry looks),
    ``substitution`` (tokens after a mismatch drafted as a same-length replacement; 0: off)
    and ``max_draft``."""

    name = "realign"
    costly = False

    def __init__(self, min_match: int = 3, window: int = 64, substitution: int = 3,
                 max_draft: int = 16):
        self.min_match = check_int("realign min_match", min_match, 1, 16)
        self.window = check_int("realign window", window, 1, 4096)
        self.substitution = check_int("realign substitution", substitution, 0, 64)
        self.max_draft = check_int("realign max_draft", max_draft, 1, MAX_DRAFT)

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "RealignSession":
        return RealignSession(self, prompt_tokens)

    def close(self) -> None:
        pass


class RealignSession:
    __slots__ = ("_p", "_hist", "_last", "_prev", "_src", "_run", "_anchor", "_since")

    def __init__(self, proposer: RealignProposer, prompt_tokens: Sequence[int]):
        self._p = proposer
        self._hist: list[int] = []
        # n-gram of min_match tokens -> the position right after its latest occurrence
        self._last: dict[tuple[int, ...], int] = {}
        self._prev: int | None = None  # the position after the tail's previous occurrence
        self._src: int | None = None  # in sync: the source position of the next token
        self._run = 0  # tokens matched since the source was found or re-entered
        self._anchor: int | None = None  # after a mismatch: where the source broke off
        self._since = 0  # tokens written since that mismatch
        for t in prompt_tokens:
            self._push(int(t))

    def _push(self, t: int) -> None:
        h = self._hist
        h.append(t)
        m = self._p.min_match
        if len(h) >= m:
            key = tuple(h[-m:])
            # where the tail occurred before (a lookup follows it), then this occurrence
            self._prev = self._last.get(key)
            self._last[key] = len(h)
        else:
            self._prev = None

    def _reenter(self) -> int | None:
        """Where the copy resumes, if the output has just come back to it: the token at the
        anchor itself (an insertion ended: the model writes what it broke off from), else
        the first place within the window after the anchor that the last two tokens match
        (a replacement or a deletion ended). One token alone elsewhere is too common."""
        h, a = self._hist, self._anchor
        assert a is not None
        end = len(h) - self._since  # the source lies before what was written since
        if a < end and h[a] == h[-1] and self._since > 1:
            return a + 1
        tail = h[-2:]
        for q in range(max(a, 2), min(a + self._p.window, end)):
            if h[q - 2:q] == tail:
                return q
        return None

    def propose(self, k: int) -> Draft:
        k = min(k, self._p.max_draft)
        h = self._hist
        if k <= 0:
            return EMPTY_DRAFT
        if self._src is not None:
            start, match = self._src, max(self._run, 1)
        elif self._anchor is not None and 0 < self._since <= self._p.substitution:
            start, match = self._anchor + self._since, 1
        else:
            return EMPTY_DRAFT
        toks = tuple(h[start:min(start + k, len(h))])
        if not toks:
            return EMPTY_DRAFT
        return Draft(tokens=toks, source="realign", match_length=match)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        for t in tokens:
            t = int(t)
            src = self._src
            if src is not None and src < len(self._hist) and self._hist[src] == t:
                self._src, self._run = src + 1, self._run + 1
                self._push(t)
                continue
            if src is not None:  # the copy broke here
                self._anchor, self._since, self._src, self._run = src, 0, None, 0
            self._push(t)
            q, run = None, 2
            if self._anchor is not None:
                self._since += 1
                q = self._reenter()
                if q is None and self._since > self._p.window:
                    self._anchor, self._since = None, 0  # lost
            if q is None:  # the tail occurs elsewhere: follow that copy instead
                q, run = self._prev, self._p.min_match
            if q is not None:
                self._src, self._run, self._anchor, self._since = q, run, None, 0

    def close(self, completed: bool) -> None:
        self._hist = []
        self._last = {}
