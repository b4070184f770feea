"""Python faces of the native objects the free proposers own.

Each class validates its arguments with messages that say what to do, then
hands int32 spans to the C library (native/es_native.h documents the
algorithms). Drafts come back as :class:`~edgespec.proposers.base.Draft`, the
one result type of every proposer; ``Draft.confidence`` carries the native
per-token figures and ``Draft.score`` the expected number of accepted tokens.
Every object reports its memory (``memory_usage()``) and checks its own
invariants (``check()``).

    >>> ix = NgramIndex(min_n=1, max_n=3)
    >>> ix.extend([1, 2, 3, 4, 1, 2])
    >>> ix.propose(6).tokens   # "1 2" occurred before, followed by 3 4 1 2 ...
    (3, 4, 1, 2, 3, 4)
"""
from __future__ import annotations

import math
import os
from typing import Optional, Protocol, Sequence, TypeVar

import numpy as np

import edgespec._native as _native
from ..errors import InvalidInputError, ensure
from ..runtime.native import (MAX_DEPTH, MAX_DRAFT, MAX_NGRAM, NGSTAT_MAX_N, NGSTAT_RECORD,
                              CapacityError, Tokens, call_with_tokens, load_sequences,
                              save_sequences)
from .base import EMPTY_DRAFT, Draft
from .checks import check_fraction, check_int
from ..decoding.tree import DraftTree

__all__ = ["NgramIndex", "NgramStats", "SuffixTree", "SuffixCursor", "DraftBar", "ngram_draft",
           "speculate", "speculate_tree", "ngram_alternatives", "check_spec_params",
           "draft_from_native", "extend_or_drop"]

#: the native source codes, by index (native/es_native.h ES_SRC_*)
SOURCES = ("", "request", "global", "context", "dynamic")


#: the binding's linear draft: (tokens, confidences, match length, score, source code)
NativeDraft = tuple[tuple[int, ...], tuple[float, ...], int, float, int]


def draft_from_native(result: NativeDraft) -> Draft:
    """The binding's (tokens, confidences, match_len, score, source) as a Draft."""
    toks, conf, m, score, src = result
    if not toks:
        return EMPTY_DRAFT
    return Draft(tokens=toks, confidence=conf, source=SOURCES[src], match_length=m, score=score)


class _Extendable(Protocol):
    def extend(self, tokens: Tokens) -> None: ...


_E = TypeVar("_E", bound=_Extendable)


def extend_or_drop(obj: Optional[_E], tokens: Tokens) -> Optional[_E]:
    """``obj.extend(tokens)``, returning obj; None when the native object could not keep
    up (over its byte cap, or the allocator refused): it no longer follows the context,
    so the session stops drafting from it (output is unaffected). Bad tokens still raise
    InvalidInputError."""
    if obj is None:
        return None
    try:
        obj.extend(tokens)
        return obj
    except MemoryError:  # CapacityError included
        return None


def _budget_error(what: str, max_bytes: int) -> InvalidInputError:
    return InvalidInputError(f"max_bytes={max_bytes} is too small for {what} "
                             "(give it at least 64 KiB)")


# --- prompt lookup ---------------------------------------------------------------------

class NgramIndex:
    """Prompt lookup over a growing token stream.

    ``propose(k)`` finds the longest suffix of the stream (``max_n`` down to
    ``min_n`` tokens) that occurred before and returns the ``k`` tokens that
    followed its most recent earlier occurrence (wrapping onto the draft itself
    when the stream ends first, so a repeating pattern drafts a full ``k``).
    Both verbs cost the same at 100 and at 100k tokens. Drafts carry no
    confidence; ``match_length`` is the matched order.
    """

    __slots__ = ("_ix", "min_n", "max_n", "max_bytes")

    def __init__(self, min_n: int = 2, max_n: int = 5, max_bytes: int = 256 << 20):
        self.min_n = check_int("min_n", min_n, 1, MAX_NGRAM)
        self.max_n = check_int("max_n", max_n, self.min_n, MAX_NGRAM)
        self.max_bytes = check_int("max_bytes", max_bytes, 1, 2**62)
        try:
            self._ix = _native.NgramIndex(self.min_n, self.max_n, self.max_bytes)
        except CapacityError:
            raise _budget_error("an n-gram index", max_bytes) from None

    def extend(self, tokens: Tokens) -> None:
        """Appends tokens. On CapacityError a prefix of them was indexed."""
        call_with_tokens(self._ix.extend, tokens)

    def propose(self, k: int) -> Draft:
        ensure(0 <= k <= MAX_DRAFT, f"k must be in [0, {MAX_DRAFT}] (got {k})")
        toks, n = self._ix.propose(k)
        return Draft(tokens=toks, source="ngram", match_length=n) if toks else EMPTY_DRAFT

    def __len__(self) -> int:
        return len(self._ix)

    def memory_usage(self) -> int:
        return self._ix.memory_usage()

    def check(self, deep: bool = False) -> None:
        """Raises IntegrityError if an invariant does not hold (deep: O(len * max_n))."""
        self._ix.check(deep=deep)


# --- n-gram statistics -------------------------------------------------------------------

class NgramStats:
    """How often each token followed each n-gram (orders ``min_n``..``max_n``).

    ``begin(context)`` starts a sequence whose first tokens continue
    ``context`` (its last tokens are the history, not counted); ``extend``
    counts each token after the n-grams ending just before it. Over
    ``max_bytes`` the table halves every count and forgets the zeros instead
    of failing (``decays`` says how often), so memory is bounded whatever
    the input.
    """

    __slots__ = ("_s", "min_n", "max_n", "max_bytes")

    def __init__(self, min_n: int = 1, max_n: int = 4, max_bytes: int = 64 << 20):
        self.min_n = check_int("min_n", min_n, 1, NGSTAT_MAX_N)
        self.max_n = check_int("max_n", max_n, self.min_n, NGSTAT_MAX_N)
        self.max_bytes = check_int("max_bytes", max_bytes, 1, 2**62)
        try:
            self._s = _native.NgramStats(self.min_n, self.max_n, self.max_bytes)
        except CapacityError:
            raise _budget_error("n-gram statistics", max_bytes) from None

    def begin(self, context: Tokens = ()) -> None:
        call_with_tokens(self._s.begin, context)

    def extend(self, tokens: Tokens) -> None:
        call_with_tokens(self._s.extend, tokens)

    def lookup(self, gram: Tokens) -> tuple[int, int, int] | None:
        """(samples, most frequent continuation, its count) after ``gram``, or None."""
        return call_with_tokens(self._s.lookup, gram)

    def top(self, gram: Tokens, k: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """The ``k`` most frequent continuations of ``gram`` (most frequent first, ties to
        the lowest token), their counts, and the n-gram's samples. One scan of the table:
        for the per-request context table, once per draft."""
        check_int("k", k, 0, _native.MAX_TREE_CHILDREN)
        return call_with_tokens(self._s.top, gram, k)

    def count(self, gram: Tokens, token: int) -> int:
        """How often ``token`` followed ``gram``."""
        check_int("token", token, 0, 2**31 - 1)

        def lookup(g: _native.Tokens) -> int:
            return self._s.lookup(g, token)
        return call_with_tokens(lookup, gram)

    def records(self) -> np.ndarray:
        """Every count as an (n, NGSTAT_RECORD) int32 array: order, token, count, n-gram."""
        return np.frombuffer(self._s.records(), dtype=np.int32).reshape(-1, NGSTAT_RECORD)

    def add_records(self, records: np.ndarray) -> None:
        """Adds exported records (validated first: a bad batch changes nothing)."""
        arr = np.ascontiguousarray(records, dtype=np.int32)
        ensure(arr.ndim == 2 and arr.shape[1] == NGSTAT_RECORD,
               f"records must be an (n, {NGSTAT_RECORD}) array (got shape {arr.shape})")
        call_with_tokens(self._s.add_records, arr.ravel())

    def decay(self) -> None:
        self._s.decay()

    @property
    def num_ngrams(self) -> int:
        return self._s.num_ngrams

    @property
    def num_pairs(self) -> int:
        return self._s.num_pairs

    @property
    def decays(self) -> int:
        return self._s.decays

    def memory_usage(self) -> int:
        return self._s.memory_usage()

    def check(self, deep: bool = False) -> None:
        """Raises IntegrityError if an invariant does not hold (deep: every count)."""
        self._s.check(deep=deep)


class DraftBar:
    """The evidence a drafted token needs, compiled once for :func:`ngram_draft`.

    At draft position i (0-based) an n-gram of the context statistics passes
    when it was seen at least ``context_counts[i]`` times, plus
    ``order_extra[n]`` for its order n, and its most frequent continuation
    has at least ``context_shares[i]`` of those samples; the dynamic
    statistics have their own counts and shares. The last value of each list
    holds for later positions (and orders).
    """

    __slots__ = ("packed", "description")

    def __init__(self, order_extra: Sequence[int], context_counts: Sequence[int],
                 context_shares: Sequence[float], dynamic_counts: Sequence[int],
                 dynamic_shares: Sequence[float]):
        try:
            self.packed = _native.ngram_params(list(order_extra), list(context_counts),
                                               list(context_shares), list(dynamic_counts),
                                               list(dynamic_shares))
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"n-gram draft thresholds: {e}") from None
        self.description = dict(order_extra=tuple(order_extra), context_counts=tuple(context_counts),
                                context_shares=tuple(context_shares),
                                dynamic_counts=tuple(dynamic_counts),
                                dynamic_shares=tuple(dynamic_shares))

    def __repr__(self) -> str:
        return f"DraftBar({', '.join(f'{k}={v}' for k, v in self.description.items())})"


def ngram_draft(context: NgramStats | None, dynamic: NgramStats | None, max_tokens: int,
                bar: DraftBar) -> Draft:
    """Drafts from the end of ``context``'s history: at each position the most frequent
    continuation of the longest n-gram whose evidence passes ``bar`` (context first,
    then dynamic), stopping where none passes. ``confidence`` is each token's share,
    ``score`` the sum of their running products (the expected accepted length),
    ``source`` the first token's table ("context" or "dynamic")."""
    check_int("max_tokens", max_tokens, 0, MAX_DRAFT)
    return draft_from_native(_native.ngram_draft(context._s if context is not None else None,
                                                 dynamic._s if dynamic is not None else None,
                                                 max_tokens, bar.packed))


# --- suffix trees ------------------------------------------------------------------------

class SuffixTree:
    """A depth-bounded suffix tree with occurrence counts over a FIFO of sequences.

    A per-request tree keeps one open sequence (``begin()`` then ``extend()``);
    a global tree stores closed sequences (``add()``) and evicts the oldest ones
    whenever an insertion would pass ``max_bytes``.
    """

    __slots__ = ("_t", "max_bytes")

    def __init__(self, max_depth: int = 64, max_bytes: int = 64 << 20):
        depth = check_int("max_depth", max_depth, 2, MAX_DEPTH)
        self.max_bytes = check_int("max_bytes", max_bytes, 1, 2**62)
        try:
            self._t = _native.SuffixTree(depth, self.max_bytes)
        except CapacityError:
            raise _budget_error(f"a suffix tree of depth {depth}", max_bytes) from None

    @property
    def max_depth(self) -> int:
        return self._t.max_depth

    @property
    def num_sequences(self) -> int:
        return self._t.num_sequences

    @property
    def num_tokens(self) -> int:
        return self._t.num_tokens

    @property
    def num_nodes(self) -> int:
        return self._t.num_nodes

    def begin(self) -> None:
        self._t.begin()

    def extend(self, tokens: Tokens) -> None:
        """Appends to the open sequence. On CapacityError a prefix was appended."""
        call_with_tokens(self._t.extend, tokens)

    def end(self) -> None:
        self._t.end()

    def add(self, tokens: Tokens) -> None:
        """Stores a whole sequence (begin, extend, end)."""
        call_with_tokens(self._t.add, tokens)

    def evict_oldest(self) -> None:
        self._t.evict_oldest()

    def sequences(self) -> list[np.ndarray]:
        """The stored sequences, oldest first, as int32 arrays."""
        return [np.frombuffer(self._t.sequence(i), dtype=np.int32)
                for i in range(self._t.num_sequences)]

    def memory_usage(self) -> int:
        return self._t.memory_usage()

    def check(self, deep: bool = False) -> None:
        """Raises IntegrityError if an invariant does not hold (deep: recounts
        every suffix, O(tokens * max_depth))."""
        self._t.check(deep=deep)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the closed sequences to ``path`` (atomically)."""
        save_sequences(path, self.sequences(), self.max_depth)

    def load(self, path: str | os.PathLike[str]) -> int:
        """Adds the sequences stored at ``path``, oldest first (evicting as the
        budget requires); returns how many were read. Raises CacheFileError."""
        seqs = load_sequences(path)
        for s in seqs:
            try:
                self._t.add(s)
            except CapacityError:
                pass  # a sequence larger than the whole budget keeps the prefix that fit
        return len(seqs)


class SuffixCursor:
    """Follows a request's context through a (global) tree it does not modify."""

    __slots__ = ("_c", "tree")

    def __init__(self, tree: SuffixTree):
        ensure(isinstance(tree, SuffixTree), "SuffixCursor needs a SuffixTree")
        self.tree = tree
        self._c = _native.SuffixCursor(tree._t)

    def extend(self, tokens: Tokens) -> None:
        call_with_tokens(self._c.extend, tokens)

    def match_length(self) -> int:
        """Longest suffix of the context that the tree contains, in tokens."""
        return self._c.match_length()

    def memory_usage(self) -> int:
        return self._c.memory_usage()


def check_spec_params(max_tokens: int, factor: float, offset: float, min_prob: float) -> None:
    check_int("max_tokens", max_tokens, 0, MAX_DRAFT)
    ensure(isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 0,
           f"factor must be a finite number >= 0 (got {factor!r})")
    ensure(isinstance(offset, (int, float)) and math.isfinite(offset),
           f"offset must be a finite number (got {offset!r})")
    check_fraction("min_token_prob", min_prob)


def speculate(request: SuffixTree | None, cursor: SuffixCursor | None, max_tokens: int,
              factor: float = 1.0, offset: float = 0.0, min_prob: float = 0.1) -> Draft:
    """The best-scoring draft of the request tree (from the end of its open
    sequence) and of the cursor's tree (from the cursor's context), as
    Arctic Inference's suffix decoding scores them.

    For each match length m the draft follows the most frequent continuation
    for at most ``min(max_tokens, floor(factor * m + offset))`` tokens and stops
    before a token whose path probability (the product of the empirical
    probabilities so far) would fall below ``min_prob``. ``confidence`` holds
    those path probabilities, ``score`` their sum (the expected accepted length).
    """
    check_spec_params(max_tokens, factor, offset, min_prob)
    return draft_from_native(_native.speculate(
        request._t if request is not None else None, cursor._c if cursor is not None else None,
        max_tokens, float(factor), float(offset), float(min_prob)))


def speculate_tree(request: SuffixTree | None, cursor: SuffixCursor | None, max_tokens: int,
                   factor: float = 1.0, offset: float = 0.0, min_prob: float = 0.1,
                   max_children: int = 4) -> DraftTree:
    """The ``max_tokens`` most probable continuations of the match :func:`speculate` would
    draft from, as a :class:`~edgespec.decoding.tree.DraftTree` (grown best first over at most
    ``max_children`` children per branching node, depth-first order, the most probable
    sibling first, so its first branch starts as the linear draft does).
    ``confidence`` holds path probabilities; an empty tree when nothing matched."""

    check_spec_params(max_tokens, factor, offset, min_prob)
    check_int("max_children", max_children, 1, _native.MAX_TREE_CHILDREN)
    toks, parents, probs, _m, _score, src = _native.speculate_tree(
        request._t if request is not None else None, cursor._c if cursor is not None else None,
        max_tokens, float(factor), float(offset), float(min_prob), max_children)
    return DraftTree.from_parents(toks, parents, probs, SOURCES[src])


def ngram_alternatives(context: NgramStats, history: Sequence[int], max_children: int,
                       depth: int, min_count: int = 1, min_prob: float = 0.1
                       ) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Other continuations the statistics saw at the next position: the most frequent
    tokens after the longest n-gram of ``history`` counted at least ``min_count`` times,
    each followed by its most frequent continuations (longest n-gram first) for up to
    ``depth`` tokens while the path probability (the product of the shares) stays at or
    above ``min_prob``. Returns (tokens, path probabilities) per alternative, most
    probable first: a draft tree's branches where the first token is uncertain."""
    check_int("max_children", max_children, 0, _native.MAX_TREE_CHILDREN)
    hist = [int(t) for t in history]
    top_n = context.max_n

    def longest(h: list[int]) -> tuple[int, tuple[int, int, int] | None]:
        for n in range(min(top_n, len(h)), context.min_n - 1, -1):
            e = context.lookup(h[len(h) - n:])
            if e is not None and e[0] >= min_count:
                return n, e
        return 0, None

    n, e = longest(hist)
    if e is None or max_children == 0:
        return []
    toks, counts, total = context.top(hist[len(hist) - n:], max_children)
    out: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
    for x, c in zip(toks, counts):
        prob = c / total
        if prob < min_prob:
            break
        path, probs, h = [x], [prob], hist + [x]
        while len(path) < depth:
            _, e = longest(h)
            if e is None:
                break
            q = prob * e[2] / e[0]
            if q < min_prob:
                break
            prob = q
            path.append(e[1])
            probs.append(prob)
            h.append(e[1])
        out.append((tuple(path), tuple(probs)))
    return out
