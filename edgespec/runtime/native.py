"""The native library's entry point: token coercion and the cache files.

``edgespec._native`` (native/edgespec_native.c) holds the C objects; the
proposers own them (:mod:`edgespec.proposers._native_types` wraps them). This
module keeps what every caller of the binding shares: turning token ids into
what the binding takes (:func:`as_tokens`, :func:`call_with_tokens`) and the
two cache-file formats (the suffix proposer's responses, the n-gram
proposer's statistics), which share one frame: a 16-byte magic, a fixed
header, a little-endian payload and a CRC-32 of all that.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar, Union

import numpy as np

from ..errors import EdgespecError, InvalidInputError

try:  # by its full name: the compiled module, not a name the package's face hands on
    import edgespec._native as _native
except ImportError as e:  # the engine treats ImportError as "native library not built"
    raise ImportError(
        "edgespec's native extension (edgespec._native) is not built: run `pip install -e .` "
        "or `python setup.py build_ext --inplace` in the source tree") from e

__all__ = ["CapacityError", "IntegrityError", "CacheFileError", "as_tokens", "call_with_tokens",
           "save_sequences", "load_sequences", "save_records", "load_records", "MAX_DRAFT",
           "MAX_NGRAM", "MAX_DEPTH", "NGSTAT_MAX_N", "NGSTAT_RECORD"]

#: the object's byte budget is spent; a subclass of MemoryError
CapacityError = _native.CapacityError
#: an integrity check failed: a bug in the native library, never the caller's input
IntegrityError = _native.IntegrityError
MAX_DRAFT: int = _native.MAX_DRAFT
MAX_NGRAM: int = _native.MAX_NGRAM
MAX_DEPTH: int = _native.MAX_DEPTH
NGSTAT_MAX_N: int = _native.NGSTAT_MAX_N
NGSTAT_RECORD: int = _native.NGSTAT_RECORD
_INT32_MAX = 2**31 - 1

Tokens = Union[Sequence[int], np.ndarray]
T = TypeVar("T")


class CacheFileError(EdgespecError):
    """A cache file is unreadable, truncated, of another version or corrupt."""


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


def call_with_tokens(fn: Callable[..., T], tokens: Tokens, *args) -> T:
    """``fn(tokens, *args)`` with the tokens coerced; the binding's TypeError/ValueError
    about them becomes an InvalidInputError."""
    try:
        return fn(as_tokens(tokens), *args)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(str(e)) from None


# --- the cache-file frame ------------------------------------------------------------
# magic (16 bytes), then <version u32, u32, u64, u64> (the last three mean what the
# format says), the payload, and a CRC-32 of everything before it (u32), little-endian.
_HEADER = struct.Struct("<IIQQ")


def _write_frame(path: str | os.PathLike, magic: bytes, header: tuple, payload: Iterable[bytes]) -> None:
    """Writes atomically: a temporary file beside the target, then a rename."""
    body = b"".join([magic, _HEADER.pack(*header), *payload])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(body)
        f.write(struct.pack("<I", zlib.crc32(body)))
    os.replace(tmp, path)


def _read_frame(path: str | os.PathLike, magic: bytes, version: int, what: str,
                payload_bytes: Callable[[tuple], int]) -> tuple[tuple, bytes]:
    """(header, the file's bytes) once magic, version, size and checksum hold."""
    path = Path(path)

    def bad(why: str) -> CacheFileError:
        return CacheFileError(f"{what} {path} {why}; delete it (it is rebuilt from later "
                              "responses) or point the cache path elsewhere")

    try:
        data = path.read_bytes()
    except OSError as e:
        raise CacheFileError(f"cannot read {what} {path}: {e.strerror or e}") from None
    fixed = len(magic) + _HEADER.size + 4
    if len(data) < fixed:
        raise bad("is truncated")
    if not data.startswith(magic):
        raise bad(f"is not an edgespec {what}")
    header = _HEADER.unpack_from(data, len(magic))
    if header[0] != version:
        raise bad(f"has format version {header[0]}, this edgespec reads {version}")
    want = payload_bytes(header)
    if want is None or want > len(data) or fixed + want != len(data):
        raise bad("has the wrong size for its header (truncated or corrupt)")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(memoryview(data)[:-4]) != crc:
        raise bad("fails its checksum (corrupt)")
    return header, data


def _payload_offset(magic: bytes) -> int:
    return len(magic) + _HEADER.size


# --- the suffix cache: the global tree's responses ----------------------------------
# header: version, max_depth, number of sequences, number of tokens; payload: the
# sequence lengths (u32 each), then the tokens (i32 each).
_SUFFIX_MAGIC = b"EDGESPEC-SUFFIX\0"
_SUFFIX_VERSION = 1


def save_sequences(path: str | os.PathLike, seqs: Iterable[np.ndarray], max_depth: int) -> None:
    seqs = [np.asarray(s, dtype="<i4") for s in seqs]
    lengths = np.array([len(s) for s in seqs], dtype="<u4")
    tokens = np.concatenate(seqs) if seqs else np.zeros(0, dtype="<i4")
    _write_frame(path, _SUFFIX_MAGIC, (_SUFFIX_VERSION, max_depth, len(seqs), len(tokens)),
                 [lengths.tobytes(), tokens.astype("<i4").tobytes()])


def load_sequences(path: str | os.PathLike) -> list[np.ndarray]:
    """Reads a suffix-cache file; raises CacheFileError, saying what to do, on any defect."""
    what = "suffix cache"
    (_, _depth, n_seqs, n_tokens), data = _read_frame(
        path, _SUFFIX_MAGIC, _SUFFIX_VERSION, what,
        lambda h: 4 * (h[2] + h[3]) if max(h[2], h[3]) < 2**40 else None)
    off = _payload_offset(_SUFFIX_MAGIC)
    lengths = np.frombuffer(data, dtype="<u4", count=n_seqs, offset=off).astype(np.int64)
    tokens = np.frombuffer(data, dtype="<i4", count=n_tokens, offset=off + 4 * n_seqs)
    if int(lengths.sum()) != n_tokens:
        raise CacheFileError(f"{what} {path} has sequence lengths that do not add up; delete it")
    if n_tokens and int(tokens.min()) < 0:
        raise CacheFileError(f"{what} {path} holds negative token ids; delete it")
    tokens = tokens.astype(np.int32)  # native byte order, contiguous
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [tokens[bounds[i]:bounds[i + 1]] for i in range(n_seqs)]


# --- the n-gram statistics: (n-gram, continuation, count) records --------------------
# header: version, record width (int32s), number of records, a free u64 (0); payload:
# the records as the native library exports them (see NgramStats.records).
_NGRAM_MAGIC = b"EDGESPEC-NGRAMS\0"
_NGRAM_VERSION = 1


def save_records(path: str | os.PathLike, records: np.ndarray) -> None:
    records = np.asarray(records, dtype="<i4").reshape(-1, NGSTAT_RECORD)
    _write_frame(path, _NGRAM_MAGIC, (_NGRAM_VERSION, NGSTAT_RECORD, len(records), 0),
                 [records.tobytes()])


def load_records(path: str | os.PathLike) -> np.ndarray:
    """Reads an n-gram statistics file as an (n, NGSTAT_RECORD) int32 array; raises
    CacheFileError on any defect (the native import re-validates every record)."""
    (_, width, n, _), data = _read_frame(
        path, _NGRAM_MAGIC, _NGRAM_VERSION, "n-gram statistics file",
        lambda h: 4 * h[1] * h[2] if h[1] == NGSTAT_RECORD and h[2] < 2**40 else None)
    flat = np.frombuffer(data, dtype="<i4", count=n * width, offset=_payload_offset(_NGRAM_MAGIC))
    return flat.astype(np.int32).reshape(n, width)
