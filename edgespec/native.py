"""The Python face of the native proposers (``edgespec._native``).

Inputs are validated here with messages that say what to do; the binding then
passes int32 spans to the C library without copying. Results come back as
frozen :class:`Speculation` records. Every object reports its memory
(``memory_usage()``) and can verify its own invariants (``check()``).

Worked example (prompt lookup, orders 1..3)::

    >>> ix = NgramIndex(min_n=1, max_n=3)
    >>> ix.extend([1, 2, 3, 4, 1, 2])
    >>> ix.propose(6)   # "1 2" occurred before, followed by 3 4 1 2 ...
    Speculation(tokens=(3, 4, 1, 2, 3, 4), probs=None, match_length=2, score=0.0, source='ngram')
"""
from __future__ import annotations

import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Union

import numpy as np

from .errors import EdgespecError, InvalidInputError

try:
    from . import _native
except ImportError as e:  # the engine treats ImportError as "native library not built"
    raise ImportError(
        "edgespec's native extension (edgespec._native) is not built: run `pip install -e .` "
        "or `python setup.py build_ext --inplace` in the source tree") from e

__all__ = ["Speculation", "NgramIndex", "SuffixTree", "SuffixCursor", "speculate",
           "CapacityError", "IntegrityError", "CacheFileError", "save_sequences",
           "load_sequences", "MAX_DRAFT", "MAX_NGRAM", "MAX_DEPTH"]

#: the object's byte budget is spent; a subclass of MemoryError
CapacityError = _native.CapacityError
#: an integrity check failed: a bug in the native library, never the caller's input
IntegrityError = _native.IntegrityError
MAX_DRAFT: int = _native.MAX_DRAFT
MAX_NGRAM: int = _native.MAX_NGRAM
MAX_DEPTH: int = _native.MAX_DEPTH
_INT32_MAX = 2**31 - 1

Tokens = Union[Sequence[int], np.ndarray]


class CacheFileError(EdgespecError):
    """A suffix-cache file is unreadable, truncated or corrupt."""


@dataclass(frozen=True, slots=True)
class Speculation:
    """What a native proposer drafted.

    ``probs`` are per-token empirical probabilities (the fraction of earlier
    occurrences that continued this way, cumulative along the draft); prompt
    lookup has none. ``score`` is their sum, the expected number of accepted
    tokens. ``source`` is "ngram", "request" (the per-request suffix tree),
    "global" (the tree of earlier responses), or "" for an empty draft.
    """

    tokens: tuple[int, ...]
    probs: tuple[float, ...] | None
    match_length: int
    score: float
    source: str

    def __len__(self) -> int:
        return len(self.tokens)


_SOURCES = ("", "request", "global")


def as_tokens(tokens: Tokens) -> Union[list, tuple, np.ndarray]:
    """Token ids ready for the binding: lists and tuples pass (the binding checks
    each item); arrays must be 1-D integers in [0, 2**31) and become contiguous int32."""
    if isinstance(tokens, (list, tuple)):
        return tokens
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise InvalidInputError(f"token ids must be a 1-D array (got shape {tokens.shape})")
        if tokens.dtype == np.int32:
            return np.ascontiguousarray(tokens)
        if not np.issubdtype(tokens.dtype, np.integer):
            raise InvalidInputError(f"token ids must be integers (got dtype {tokens.dtype})")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > _INT32_MAX):
            raise InvalidInputError("token ids must be in [0, 2**31)")
        return np.ascontiguousarray(tokens, dtype=np.int32)
    if isinstance(tokens, (str, bytes, bytearray)):
        raise InvalidInputError("token ids must be integers, not text or bytes; tokenize first")
    try:
        return list(tokens)
    except TypeError:
        raise InvalidInputError(
            f"token ids must be a sequence of ints (got {type(tokens).__name__})") from None


def _call(fn, tokens):
    try:
        return fn(as_tokens(tokens))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(str(e)) from None


def _guard(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInputError(message)


def _check_int(name: str, value, lo: int, hi: int) -> int:
    _guard(isinstance(value, (int, np.integer)) and not isinstance(value, bool),
           f"{name} must be an integer (got {value!r})")
    _guard(lo <= value <= hi, f"{name} must be in [{lo}, {hi}] (got {value})")
    return int(value)


class NgramIndex:
    """Prompt lookup over a growing token stream.

    ``propose(k)`` finds the longest suffix of the stream (``max_n`` down to
    ``min_n`` tokens) that occurred before and returns the ``k`` tokens that
    followed its most recent earlier occurrence (wrapping onto the draft itself
    when the stream ends first, so a repeating pattern drafts a full ``k``).
    Both verbs cost the same at 100 and at 100k tokens.
    """

    __slots__ = ("_ix", "min_n", "max_n", "max_bytes")

    def __init__(self, min_n: int = 2, max_n: int = 5, max_bytes: int = 256 << 20):
        self.min_n = _check_int("min_n", min_n, 1, MAX_NGRAM)
        self.max_n = _check_int("max_n", max_n, self.min_n, MAX_NGRAM)
        self.max_bytes = _check_int("max_bytes", max_bytes, 1, 2**62)
        try:
            self._ix = _native.NgramIndex(self.min_n, self.max_n, self.max_bytes)
        except CapacityError:
            raise InvalidInputError(f"max_bytes={max_bytes} is too small for an n-gram index "
                                    "(give it at least 64 KiB)") from None

    def extend(self, tokens: Tokens) -> None:
        """Appends tokens. On CapacityError a prefix of them was indexed."""
        _call(self._ix.extend, tokens)

    def propose(self, k: int) -> Speculation:
        _guard(0 <= k <= MAX_DRAFT, f"k must be in [0, {MAX_DRAFT}] (got {k})")
        toks, n = self._ix.propose(k)
        return Speculation(toks, None, n, 0.0, "ngram" if toks else "")

    def __len__(self) -> int:
        return len(self._ix)

    def memory_usage(self) -> int:
        return self._ix.memory_usage()

    def check(self, deep: bool = False) -> None:
        """Raises IntegrityError if an invariant does not hold (deep: O(len * max_n))."""
        self._ix.check(deep=deep)


class SuffixTree:
    """A depth-bounded suffix tree with occurrence counts over a FIFO of sequences.

    A per-request tree keeps one open sequence (``begin()`` then ``extend()``);
    a global tree stores closed sequences (``add()``) and evicts the oldest ones
    whenever an insertion would pass ``max_bytes``.
    """

    __slots__ = ("_t", "max_bytes")

    def __init__(self, max_depth: int = 64, max_bytes: int = 64 << 20):
        depth = _check_int("max_depth", max_depth, 2, MAX_DEPTH)
        self.max_bytes = _check_int("max_bytes", max_bytes, 1, 2**62)
        try:
            self._t = _native.SuffixTree(depth, self.max_bytes)
        except CapacityError:
            raise InvalidInputError(f"max_bytes={max_bytes} is too small for a suffix tree of "
                                    f"depth {depth} (give it at least 64 KiB)") from None

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
        _call(self._t.extend, tokens)

    def end(self) -> None:
        self._t.end()

    def add(self, tokens: Tokens) -> None:
        """Stores a whole sequence (begin, extend, end)."""
        _call(self._t.add, tokens)

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

    def save(self, path: str | os.PathLike) -> None:
        """Writes the closed sequences to ``path`` (atomically)."""
        save_sequences(path, self.sequences(), self.max_depth)

    def load(self, path: str | os.PathLike) -> int:
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
        if not isinstance(tree, SuffixTree):
            raise InvalidInputError("SuffixCursor needs a SuffixTree")
        self.tree = tree
        self._c = _native.SuffixCursor(tree._t)

    def extend(self, tokens: Tokens) -> None:
        _call(self._c.extend, tokens)

    def match_length(self) -> int:
        """Longest suffix of the context that the tree contains, in tokens."""
        return self._c.match_length()

    def memory_usage(self) -> int:
        return self._c.memory_usage()


def check_spec_params(max_tokens: int, factor: float, offset: float, min_prob: float) -> None:
    _check_int("max draft tokens", max_tokens, 0, MAX_DRAFT)
    _guard(isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 0,
           f"factor must be a finite number >= 0 (got {factor!r})")
    _guard(isinstance(offset, (int, float)) and math.isfinite(offset),
           f"offset must be a finite number (got {offset!r})")
    _guard(isinstance(min_prob, (int, float)) and 0.0 <= min_prob <= 1.0,
           f"min_token_prob must be in [0, 1] (got {min_prob!r})")


def speculate(request: SuffixTree | None, cursor: SuffixCursor | None, max_tokens: int,
              factor: float = 1.0, offset: float = 0.0, min_prob: float = 0.1) -> Speculation:
    """The best-scoring draft of the request tree (from the end of its open
    sequence) and of the cursor's tree (from the cursor's context).

    For each match length m the draft follows the most frequent continuation
    for at most ``min(max_tokens, floor(factor * m + offset))`` tokens and stops
    before a token whose probability would fall below ``min_prob``.
    """
    check_spec_params(max_tokens, factor, offset, min_prob)
    toks, probs, m, score, src = _native.speculate(
        request._t if request is not None else None, cursor._c if cursor is not None else None,
        max_tokens, float(factor), float(offset), float(min_prob))
    return Speculation(toks, probs, m, score, _SOURCES[src])


# --- the suffix-cache file ---------------------------------------------------------
# magic, then <version u32, max_depth u32, n_seqs u64, n_tokens u64>, the sequence
# lengths (u32 each), the tokens (i32 each), and a CRC-32 of all that (u32).
# Everything little-endian.
_MAGIC = b"EDGESPEC-SUFFIX\0"
_HEADER = struct.Struct("<IIQQ")
_VERSION = 1


def save_sequences(path: str | os.PathLike, seqs: Iterable[np.ndarray], max_depth: int) -> None:
    seqs = [np.asarray(s, dtype="<i4") for s in seqs]
    lengths = np.array([len(s) for s in seqs], dtype="<u4")
    tokens = np.concatenate(seqs) if seqs else np.zeros(0, dtype="<i4")
    body = b"".join([_MAGIC, _HEADER.pack(_VERSION, max_depth, len(seqs), len(tokens)),
                     lengths.tobytes(), tokens.astype("<i4").tobytes()])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(body)
        f.write(struct.pack("<I", zlib.crc32(body)))
    os.replace(tmp, path)


def load_sequences(path: str | os.PathLike) -> list[np.ndarray]:
    """Reads a suffix-cache file; raises CacheFileError, saying what to do, on any defect."""
    path = Path(path)

    def bad(why: str) -> CacheFileError:
        return CacheFileError(f"suffix cache {path} {why}; delete it (it is rebuilt from "
                              "later responses) or point the cache path elsewhere")

    try:
        data = path.read_bytes()
    except OSError as e:
        raise CacheFileError(f"cannot read suffix cache {path}: {e.strerror or e}") from None
    fixed = len(_MAGIC) + _HEADER.size + 4
    if len(data) < fixed:
        raise bad("is truncated")
    if not data.startswith(_MAGIC):
        raise bad("is not an edgespec suffix cache")
    version, _depth, n_seqs, n_tokens = _HEADER.unpack_from(data, len(_MAGIC))
    if version != _VERSION:
        raise bad(f"has format version {version}, this edgespec reads {_VERSION}")
    if n_seqs > len(data) or n_tokens > len(data) or fixed + 4 * (n_seqs + n_tokens) != len(data):
        raise bad("has the wrong size for its header (truncated or corrupt)")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(memoryview(data)[:-4]) != crc:
        raise bad("fails its checksum (corrupt)")
    off = len(_MAGIC) + _HEADER.size
    lengths = np.frombuffer(data, dtype="<u4", count=n_seqs, offset=off).astype(np.int64)
    tokens = np.frombuffer(data, dtype="<i4", count=n_tokens, offset=off + 4 * n_seqs)
    if int(lengths.sum()) != n_tokens:
        raise bad("has sequence lengths that do not add up")
    if n_tokens and int(tokens.min()) < 0:
        raise bad("holds negative token ids")
    tokens = tokens.astype(np.int32)  # native byte order, contiguous
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [tokens[bounds[i]:bounds[i + 1]] for i in range(n_seqs)]
