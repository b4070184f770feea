"""Lookahead decoding (after Fu et al. 2024, "Break the Sequential Dependency of LLM
Inference Using Lookahead Decoding", and llama.cpp's ``examples/lookahead``), as a proposer.

The paper runs two branches in every target pass. The *lookahead branch* is a 2-D window
of ``W`` positions times ``N - 1`` levels of guessed tokens; one pass performs a Jacobi
iteration on it (the target's output at each guessed position becomes the next guess
there) and every column's trajectory becomes an ``N``-gram in a *pool*. The *verification
branch* verifies the pool's ``N``-grams whose first token is the last accepted one.

Here the target's verify pass is the only place rows are computed, and it is the loop's,
not this proposer's. What is implemented:

* **The pool** (:class:`NgramPool`): ``N``-grams keyed by their first token, at most ``G``
  continuations per key, the most seen (then most recent) first; bounded by ``max_keys``.
  It is fed the lookahead signal below and, unlike llama.cpp's (fed by the window alone),
  the prompt's and the output's own ``N``-grams.
* **One-dimensional Jacobi iterations on the verify pass's rows.** A draft is the pool's
  best candidate for the pending token, then the *window*'s guesses (one level of ``W``
  guessed tokens, seeded from the prompt). The loop hands the session the target's rows of
  each linear pass (:meth:`LookaheadSession.observe_pass`; a tree pass hands none): the raw
  argmax at every row past the first rejection is the target's output on a guessed prefix
  (penalties aside), which is the Jacobi
  update of those positions (:func:`jacobi_update`) and, with the ``N - 1`` tokens before
  it, a new ``N``-gram for the pool (:func:`speculative_ngrams`), as a column
  trajectory of the paper's window yields one.
* **The verification branch**: :meth:`LookaheadSession.propose_tree` offers the pool's
  candidates (as many as the tree pass allows children, of the ``G`` kept) as one draft
  tree; the loop's tree pass verifies them in one pass where the device's measured curve
  says the extra rows pay (``edgespec.loop.treepass``). Elsewhere only the best one is
  verified, linearly.

What is not: the paper's ``N - 1`` levels run as extra rows of their own, beside the
verified ones, with a custom attention mask, so that a pass advances the whole 2-D window
whatever is verified. Here the window only advances on the rows the controller spent on a
draft: on a steep (CPU) curve it drafts little and the pool is mostly the context's own
``N``-grams (a prompt lookup); where rows are cheap (a flat GPU curve) it drafts longer
and each pass is also a Jacobi step. The controller sizes every draft from the device's
cost curve, as for every proposer; nothing here assumes a curve.

The proposer only proposes: verification (greedy, or exact rejection sampling of a point
mass) is the loop's, so the output is the plain path's.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..api.arrays import FloatArray
from ..api.params import SamplingParams
from ..decoding.tree import DraftTree
from ..errors import InvalidInputError
from .base import EMPTY_DRAFT, Draft
from .checks import check_int

__all__ = ["LookaheadProposer", "LookaheadSession", "NgramPool", "jacobi_update",
           "speculative_ngrams", "MAX_N", "MAX_WINDOW", "MAX_POOL"]

MAX_N = 8  # the longest n-gram the pool keeps (the paper's N; llama.cpp's default is 5)
MAX_WINDOW = 64  # the most guessed positions in the window (the paper's W)
MAX_POOL = 64  # the most candidates per first token (the paper's G)
MAX_DRAFT = 64
#: confidence of a window guess: a Jacobi guess the target has not confirmed
JACOBI_CONFIDENCE = 0.05


class NgramPool:
    """``n``-grams keyed by their first token: at most ``g`` continuations (``n - 1`` tokens
    each) per key, ranked by how often they were seen, then by recency; at most
    ``max_keys`` keys (the least recently fed key goes first).

        >>> pool = NgramPool(n=3, g=2)
        >>> pool.add_all([1, 2, 3, 1, 2, 4, 1, 2, 3])
        >>> pool.candidates(1)
        [(2, 3), (2, 4)]
    """

    def __init__(self, n: int, g: int, max_keys: int = 1 << 16) -> None:
        self.n = check_int("lookahead n", n, 2, MAX_N)
        self.g = check_int("lookahead pool", g, 1, MAX_POOL)
        self.max_keys = check_int("lookahead max_keys", max_keys, 1, 1 << 24)
        # key -> {continuation: count}; dict order is recency (the last is the newest)
        self._keys: dict[int, dict[tuple[int, ...], int]] = {}

    def __len__(self) -> int:
        return sum(len(c) for c in self._keys.values())

    def add(self, ngram: Sequence[int]) -> None:
        """Counts one ``n``-gram (a longer or shorter sequence is refused)."""
        if len(ngram) != self.n:
            raise InvalidInputError(f"an n-gram of the pool has {self.n} tokens, not "
                                    f"{len(ngram)}")
        key, cont = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        conts = self._keys.pop(key, None)
        if conts is None:
            conts = {}
            if len(self._keys) >= self.max_keys:
                del self._keys[next(iter(self._keys))]
        self._keys[key] = conts
        count = conts.pop(cont, 0) + 1
        if count == 1 and len(conts) >= self.g:
            # full: the least seen, then the oldest, makes room
            del conts[min(conts, key=lambda c: conts[c])]
        conts[cont] = count

    def add_all(self, tokens: Sequence[int], start: int = 0) -> None:
        """Counts every ``n``-gram of ``tokens`` that ends at index ``start`` or later."""
        n = self.n
        for end in range(max(start, n - 1), len(tokens)):
            self.add(tokens[end - n + 1: end + 1])

    def candidates(self, first: int) -> list[tuple[int, ...]]:
        """Continuations of ``first``, the most seen first (ties: the newest first)."""
        conts = self._keys.get(int(first))
        if not conts:
            return []
        newest_first = list(reversed(conts))
        return sorted(newest_first, key=lambda c: -conts[c])

    def share(self, first: int, cont: tuple[int, ...]) -> float:
        """How often ``cont`` followed ``first``, among the counted continuations."""
        conts = self._keys.get(int(first), {})
        total = sum(conts.values())
        return conts.get(cont, 0) / total if total else 0.0


def jacobi_update(window: Sequence[int], outputs: Sequence[int], n_new: int) -> list[int]:
    """The window after one verify pass: the Jacobi iteration of its guesses.

    ``window[j]`` guessed the token at position ``p + j`` (``p``: the position after the
    pending token); the pass evaluated the pending token and ``len(outputs) - 1`` drafted
    ones, and ``outputs[i]`` is the target's argmax after input ``i``: its new guess for
    position ``p + i``, conditioned on the drafted prefix before it. ``n_new`` tokens
    were appended (accepted drafts and the target's own), so the new window starts at
    position ``p + n_new``.

        >>> jacobi_update([5, 6, 7, 8], outputs=[5, 9, 3], n_new=2)   # 5 kept, 9 emitted
        [3, 8]
    """
    merged = [*outputs, *window[len(outputs):]]
    return [int(t) for t in merged[n_new:]]


def speculative_ngrams(context: Sequence[int], draft: Sequence[int], outputs: Sequence[int],
                       n: int, first_row: int) -> list[tuple[int, ...]]:
    """The ``n``-grams one pass's speculative rows yield: for each row ``i`` from
    ``first_row``, the ``n - 1`` tokens up to input ``i`` (``context`` ends with the pending
    token, input 0; input ``i > 0`` is ``draft[i - 1]``) followed by the target's output
    there. Rows past the first rejection condition on a guessed prefix: each such
    ``n``-gram is one column trajectory of the paper's lookahead window.

        >>> speculative_ngrams([1, 2], draft=[3, 4], outputs=[3, 7, 8], n=3, first_row=1)
        [(2, 3, 7), (3, 4, 8)]
    """
    seq = [*context, *draft]
    base = len(context) - 1  # index in seq of input 0
    out = []
    for i in range(max(first_row, 0), min(len(outputs), len(draft) + 1)):
        lo = base + i - (n - 2)
        if lo < 0:
            continue
        out.append(tuple(int(t) for t in (*seq[lo: base + i + 1], outputs[i])))
    return out


class LookaheadProposer:
    """Knobs (the paper's names): ``n`` (N, the n-gram size: candidates are ``n - 1``
    tokens), ``window`` (W, guessed positions kept past the pending token), ``pool``
    (G, candidates per first token), ``max_draft`` (the most tokens per draft; the
    controller asks for fewer where the device's curve says so) and ``max_keys`` (the
    pool's memory cap, in first tokens). Defaults are llama.cpp's (N=5, W=15, G=15)."""

    name = "lookahead"
    costly = False

    def __init__(self, n: int = 5, window: int = 15, pool: int = 15, max_draft: int = 15,
                 max_keys: int = 1 << 16) -> None:
        self.n = check_int("lookahead n", n, 2, MAX_N)
        self.window = check_int("lookahead window", window, 1, MAX_WINDOW)
        self.pool = check_int("lookahead pool", pool, 1, MAX_POOL)
        self.max_draft = check_int("lookahead max_draft", max_draft, 1, MAX_DRAFT)
        self.max_keys = check_int("lookahead max_keys", max_keys, 1, 1 << 24)

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "LookaheadSession":
        return LookaheadSession(self, prompt_tokens)

    def close(self) -> None:
        """Nothing outlives a request: each session owns its pool."""


class LookaheadSession:
    """One request's pool, window and history (see the module's docstring)."""

    def __init__(self, proposer: LookaheadProposer, prompt_tokens: Sequence[int]) -> None:
        self._p = proposer
        self._hist = [int(t) for t in prompt_tokens]
        self._pool = NgramPool(proposer.n, proposer.pool, proposer.max_keys)
        self._pool.add_all(self._hist)
        self._window: list[int] = []
        # the window's first guesses are prompt tokens, as llama.cpp seeds its window;
        # seeded per request so that a rerun drafts the same
        self._rng = np.random.default_rng(len(self._hist))
        self._pass: tuple[list[int], FloatArray] | None = None  # (draft, the pass's rows)
        self._closed = False
        #: n-grams the speculative rows gave the pool (the lookahead branch's yield)
        self.jacobi_ngrams = 0

    @property
    def pool(self) -> NgramPool:
        return self._pool

    @property
    def window(self) -> list[int]:
        return list(self._window)

    def propose(self, k: int) -> Draft:
        """The pool's best candidate after the pending token, then the window's guesses."""
        k = min(k, self._p.max_draft)
        if k <= 0 or self._closed or not self._hist:
            return EMPTY_DRAFT
        self._fill_window()
        key = self._hist[-1]
        cands = self._pool.candidates(key)
        toks: list[int] = []
        conf: list[float] = []
        if cands:
            toks = list(cands[0][:k])
            conf = [self._pool.share(key, cands[0])] * len(toks)
        rest = self._window[len(toks):k]
        toks += rest
        conf += [JACOBI_CONFIDENCE] * len(rest)
        return Draft(tokens=tuple(toks), confidence=tuple(conf),
                     source="pool" if cands else "jacobi", match_length=1 if cands else 0)

    def propose_tree(self, k: int, max_children: int = 4) -> DraftTree:
        """The verification branch: :meth:`propose`'s draft first, then the pool's other
        candidates for the pending token (at most ``max_children`` paths), one tree."""
        first = self.propose(k)
        if not first.tokens:
            return DraftTree((), ())
        key = self._hist[-1]
        others = self._pool.candidates(key)[1:max(1, max_children)]
        paths: list[Sequence[int]] = [first.tokens, *(c[:k] for c in others)]
        confs: list[Sequence[float]] = [
            first.confidence or (), *([self._pool.share(key, c)] * len(c[:k]) for c in others)]
        return DraftTree.from_paths(paths, confs, source="lookahead", max_nodes=k)

    def observe_pass(self, tokens: Sequence[int], rows: FloatArray) -> None:
        """The target's rows of the pass about to be accepted: ``tokens`` were its inputs
        (the pending token, then the draft), ``rows[i]`` the logits after input ``i``.
        Kept until :meth:`accept`, which reads only the rows past the verified ones."""
        self._pass = None
        if self._closed or not tokens or not self._hist or int(tokens[0]) != self._hist[-1]:
            return
        rows = np.asarray(rows)
        if rows.ndim != 2 or len(rows) != len(tokens):
            return  # not one row per input: nothing to align
        self._pass = ([int(t) for t in tokens[1:]], rows)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        new = [int(t) for t in tokens]
        observed, self._pass = self._pass, None
        if self._closed or not new:
            return
        n_new = len(new)
        if observed is not None and observed[0][:n_new - 1] == new[:-1]:
            draft, rows = observed
            # rows before n_new were verified (their tokens are `new`); the rest are the
            # target's outputs on a guessed prefix: the Jacobi step
            outs = [*new, *(int(t) for t in np.argmax(rows[n_new:], axis=1))]
            for g in speculative_ngrams(self._hist, draft, outs, self._p.n, first_row=n_new):
                self._pool.add(g)
                self.jacobi_ngrams += 1
            self._window = jacobi_update(self._window, outs, n_new)
        else:
            self._window = self._window[n_new:]
        start = len(self._hist)
        self._hist.extend(new)
        self._pool.add_all(self._hist, start=start)

    def _fill_window(self) -> None:
        """Pads the window to W guesses: the pool's best successor of the last guess, else a
        prompt token drawn at random (llama.cpp's seeding)."""
        want = self._p.window
        if len(self._window) >= want:
            del self._window[want:]
            return
        last = self._window[-1] if self._window else self._hist[-1]
        while len(self._window) < want:
            cands = self._pool.candidates(last)
            last = cands[0][0] if cands else self._hist[int(self._rng.integers(len(self._hist)))]
            self._window.append(last)

    def memory_usage(self) -> int:
        """About the bytes this session holds (Python objects, counted coarsely)."""
        return 64 * (len(self._hist) + len(self._window)) + 96 * self._p.n * len(self._pool)

    def close(self, completed: bool) -> None:
        self._closed = True
        self._hist, self._window, self._pass = [], [], None
        self._pool = NgramPool(self._p.n, self._p.pool, 1)
