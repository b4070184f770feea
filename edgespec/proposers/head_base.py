"""What the proposers whose head is fed by the target's verify pass share (``mtp``, ``eagle3``).

Both draft with a small head of their own context that reads, at each of its KV positions,
a token paired with a row the *target* produced for it (a hidden state, or layer features)
and taken from the target's verify pass by a row tap (:mod:`edgespec.runtime.taps`). They
differ only in which token a head position reads (its ``lead``), how wide a target row is,
and how a row becomes the head's input; the bookkeeping that keeps the head's cache in step
with the accepted sequence is one piece of code, here, so a fix to it reaches both:

* head position ``P`` pairs token ``seq[P + lead]`` with the target's row of position
  ``P + lead - 1`` (MTP: ``lead`` 0, ``(x_p, h_{p-1})``; EAGLE-3: ``lead`` 1,
  ``(t_{P+1}, g_P)``): the target has decoded every position of the accepted sequence but
  its last, so the head's cache can reach ``len(seq) - 1 - lead``;
* ``propose`` catches the head up on the positions accepted since the last draft (the last
  one yields the first draft token), feeds each further draft token back with the head's
  own state, then drops those draft positions: the cache is in step with the accepted
  sequence after every step, whatever was accepted;
* a row the target never produced here (a prefix restored from the KV cache instead of
  decoded) reads as zeros and is counted (``missing_rows``): drafts may be worse, the output
  never changes (verification decides). One request at a time, on the target's sequence 0.
"""
from __future__ import annotations

import time
from typing import Generic, Protocol, Sequence, TypeVar

import numpy as np

from ..api.params import SamplingParams
from ..decoding.sampling import make_rng
from .base import EMPTY_DRAFT, Draft
from .draft import choose_token, fit_row


class HeadContext(Protocol):
    """What a session needs of a head's context (``MtpContext``, ``Eagle3Context``)."""
    n_ctx: int
    n_embd: int

    def decode(self, tokens: list[int], pos0: int, rows: np.ndarray,
               want: bool = True) -> tuple[np.ndarray, np.ndarray] | None: ...

    def trim(self, from_pos: int) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class Rows(Protocol):
    """What a session needs of a row tap (:class:`edgespec.runtime.taps.RowTap`)."""

    def row(self, seq: int, pos: int) -> np.ndarray | None: ...

    def forget_below(self, seq: int, pos: int) -> None: ...

    def detach(self) -> None: ...


HeadT = TypeVar("HeadT", bound=HeadContext)


class HeadProposer(Generic[HeadT]):
    """The owner of a head and its tap: one session at a time (the head's cache is one
    sequence), the running cost estimate the controller reads, the missing-row count."""
    name: str
    costly = True
    #: what serves one request at a time, for the refusal of a second one
    serves = "the head"

    def __init__(self, head: HeadT, tap: Rows, target_vocab: int, max_draft: int = 3,
                 target_seq: int = 0) -> None:
        self.head = head
        self.tap = tap
        self.target_vocab = int(target_vocab)
        self.max_draft = max(1, int(max_draft))
        self.target_seq = target_seq
        self.seconds_per_token = 0.0  # running estimate, read by the controller
        self.missing_rows = 0  # target rows read as zeros (never decoded by the target here)
        self._busy = False

    def open(self, prompt_tokens: Sequence[int],
             sampling: SamplingParams) -> "HeadSession[HeadT]":
        if self._busy:
            raise RuntimeError(f"{self.serves} serves one request at a time")
        self.head.clear()
        self._busy = True
        return self._session([int(t) for t in prompt_tokens], sampling)

    def _session(self, tokens: list[int], sampling: SamplingParams) -> "HeadSession[HeadT]":
        """The kind's session class: it alone knows the head's input (abstract)."""
        raise NotImplementedError

    def _release(self) -> None:
        self._busy = False

    def note_cost(self, seconds_per_token: float) -> None:
        """Fold one draft's measured cost into the running estimate: smoothed, because one
        draft's timing is noisy and the controller weighs it at every step."""
        s = self.seconds_per_token
        self.seconds_per_token = seconds_per_token if s == 0 else 0.8 * s + 0.2 * seconds_per_token

    def close(self) -> None:
        try:
            self.tap.detach()
        finally:
            self.head.close()


class HeadSession(Generic[HeadT]):
    """One request's drafts; a kind sets ``lead`` and says how wide a target row is and how
    rows become the head's input (the module doc gives the positions)."""
    #: how far ahead of a head position the token it reads stands
    lead = 0

    def __init__(self, owner: HeadProposer[HeadT], tokens: list[int],
                 sampling: SamplingParams) -> None:
        self.owner = owner
        self.seq = tokens  # the accepted sequence, as the target sees it
        #: the head's cache holds positions [0, kv_len), each made from the target's rows
        self.kv_len = 0
        self.sampling = sampling
        self._rng = None if sampling.greedy else make_rng(sampling.seed, "draft")

    def _width(self) -> int:
        """How wide a target row is (a zero row stands in for a missing one)."""
        raise NotImplementedError

    def _head_input(self, rows: np.ndarray) -> np.ndarray:
        """The head's input rows for the target's rows (MTP reads them as they are)."""
        return rows

    def _target_row(self, pos: int) -> np.ndarray:
        """The target's row of position ``pos`` (zeros before the start, uncounted)."""
        o = self.owner
        row = o.tap.row(o.target_seq, pos) if pos >= 0 else None
        if row is None:
            if pos >= 0:
                o.missing_rows += 1
            return np.zeros(self._width(), dtype=np.float32)
        return row

    def _catch_up(self) -> tuple[np.ndarray, np.ndarray]:
        """Decode the head's positions kv_len .. len(seq)-1-lead from the target's rows; the
        logits and state of the last one (which predict the first draft token)."""
        o, lead = self.owner, self.lead
        top = len(self.seq) - 1 - lead
        start = min(self.kv_len, top)
        if start < self.kv_len:
            o.head.trim(start)  # the last position is decoded again for its output
        rows = np.stack([self._target_row(p + lead - 1) for p in range(start, top + 1)])
        out = o.head.decode(self.seq[start + lead:top + lead + 1], start,
                            self._head_input(rows), want=True)
        assert out is not None
        self.kv_len = top + 1
        o.tap.forget_below(o.target_seq, len(self.seq) - 2)
        return out

    def propose(self, k: int) -> Draft:
        o = self.owner
        k = min(k, o.max_draft)
        if k <= 0 or len(self.seq) <= self.lead or len(self.seq) + k >= o.head.n_ctx:
            return EMPTY_DRAFT
        t0 = time.perf_counter()
        logits, h = self._catch_up()
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        conf: list[float] = []
        history = list(self.seq)
        for i in range(k):
            tok, p, c = self._choose(fit_row(logits, o.target_vocab), history)
            tokens.append(tok)
            conf.append(c)
            if p is not None:
                probs.append(p)
            history.append(tok)
            if i + 1 < k:
                out = o.head.decode([tok], self.kv_len + i, h[None, :], want=True)
                assert out is not None
                logits, h = out
        if k > 1:
            o.head.trim(self.kv_len)  # draft positions: never kept (see the module doc)
        o.note_cost((time.perf_counter() - t0) / k)
        return Draft(tokens=tuple(tokens), probs=np.stack(probs) if probs else None,
                     confidence=tuple(conf), source=o.name)

    def _choose(self, logits: np.ndarray,
                history: list[int]) -> tuple[int, np.ndarray | None, float]:
        return choose_token(logits, history, self.sampling, self._rng)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:  # noqa: ARG002
        # the cache already holds only positions made from the target's rows; the new
        # tokens are decoded at the next catch-up
        self.seq.extend(int(t) for t in tokens)

    def close(self, completed: bool) -> None:  # noqa: ARG002
        self.owner._release()
