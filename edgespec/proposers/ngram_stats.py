"""The n-gram statistics of past generations, kept across requests and runs.

The ``ngram`` proposer drafts from two tables (after llama.cpp's ngram-cache):
a per-request *context* table over prompt + output, and this *dynamic* table
over earlier generations, consulted when the context has nothing confident
to offer. Counts are token ids, meaningful for one vocabulary only, so the
table persists only when keyed: by the target model's digest (a file under
:func:`edgespec.paths.ngram_dir`) or by an explicit path.

The file is the native records in the cache-file frame of
:mod:`edgespec.runtime.native` (magic, version, sizes, CRC-32), written atomically on
``save()``. A file that cannot be used (corrupt, truncated, another version,
unreadable) is never fatal: :class:`StatsFileWarning` says so, the table starts
empty, and the unusable file is set aside as ``<name>.bad`` when the first save
replaces it, so nothing is silently lost.
"""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Sequence

from .. import paths
from ..errors import InvalidInputError
from ..runtime.native import CacheFileError, Tokens, load_records, save_records
from ._native_types import NgramStats

__all__ = ["DynamicStats", "StatsFileWarning", "stats_file"]

_DIGEST = re.compile(r"^[0-9A-Za-z._-]{1,128}$")


class StatsFileWarning(RuntimeWarning):
    """The persisted n-gram statistics could not be used; drafting starts from scratch."""


def stats_file(model_digest: str) -> Path:
    """Where the statistics of the model with this digest live."""
    if not isinstance(model_digest, str) or not _DIGEST.match(model_digest):
        raise InvalidInputError(f"model_digest must be a file-name-safe string such as a sha256 hex "
                                f"digest (got {model_digest!r})")
    return paths.ngram_dir() / f"{model_digest}.ngrams"


class DynamicStats:
    """The dynamic table: what earlier generations continued, persisted when keyed.

    ``remember(prompt, output)`` counts a finished generation's n-grams (its
    first n-grams reach back into the prompt's tail, which is not counted).
    """

    def __init__(self, min_n: int, max_n: int, max_bytes: int, path: str | os.PathLike[str] | None):
        self.table = NgramStats(min_n, max_n, max_bytes)
        self.path = Path(path).expanduser() if path is not None else None
        self._dirty = False
        self._unusable = False  # the file on disk could not be read: keep it aside on save
        if self.path is not None and self.path.exists():
            self._load(self.path)

    def _load(self, path: Path) -> None:
        try:
            self.table.add_records(load_records(path))
        except (CacheFileError, InvalidInputError) as e:
            # InvalidInputError: a checksummed file whose records the native import refused
            self._unusable = True
            warnings.warn(f"ignoring the n-gram statistics in {path}: {e}. Drafting starts "
                          f"from empty statistics; the file is kept as {path.name}.bad when "
                          "new statistics are saved", StatsFileWarning, stacklevel=3)

    def remember(self, prompt: Tokens, output: Sequence[int]) -> None:
        if not output:
            return
        self.table.begin(prompt[-self.table.max_n:])
        try:
            self.table.extend(output)
        except MemoryError:
            pass  # the allocator refused mid-way: a prefix was counted, the table is consistent
        self._dirty = True

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Writes the table atomically to ``path`` (default: the keyed path)."""
        target = Path(path).expanduser() if path is not None else self.path
        if target is None:
            raise InvalidInputError("no n-gram statistics path: pass one, or a model_digest")
        if self._unusable and target == self.path and target.exists():
            os.replace(target, target.with_name(target.name + ".bad"))
            self._unusable = False
        save_records(target, self.table.records())
        if target == self.path:
            self._dirty = False

    def close(self) -> None:
        """Saves what changed, if keyed; never raises for a disk that refuses."""
        if self.path is None or not self._dirty:
            return
        try:
            self.save()
        except OSError as e:
            warnings.warn(f"could not save the n-gram statistics to {self.path}: {e}",
                          StatsFileWarning, stacklevel=2)

