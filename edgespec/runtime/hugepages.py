"""Transparent huge pages for the memory llama.cpp allocates: weights, KV cache, buffers.

Why: a decode step reads every weight once. On 4 KiB pages a 1.5B model's ~1.2 GB of weights
span ~300,000 pages, far more than the TLB holds, so each step pays a page walk per page.
Measured on a 2-core Xeon (docs/benchmarks.md): qwen-1.5b decodes 14.1 tok/s on 4 KiB pages
and 17.1 on 2 MiB pages; llama-completion gains the same with glibc's hugetlb tunable.

Linux's usual THP mode, ``madvise``, gives huge pages only to ranges a process marks with
MADV_HUGEPAGE, and ggml allocates with plain posix_memalign. So :class:`Advice` notes the
anonymous ranges mapped before a load, and marks those that appeared since: before the loader
writes any weight (the first progress callback, when the buffers exist untouched), so the
weights fault in as huge pages; pages touched earlier (a KV cache llama.cpp clears) are
collapsed with MADV_COLLAPSE one 2 MiB block at a time (a call over a range that holds an
unpopulated block fails whole). Weights served from a mapped file stay on the page cache's
pages. Nothing here changes a computed value, and everything is best effort: off Linux, with
THP off, or when the kernel refuses, each call does nothing. ``EDGESPEC_HUGE_PAGES=0`` turns it
off (for measuring the difference).
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Iterable, Sequence

BLOCK = 2 << 20          # x86-64 and arm64 (4 KiB base pages) PMD size
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25       # Linux 6.1+
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
MIN_RANGE = 4 * BLOCK    # smaller mappings are not weights or caches worth a syscall

Range = tuple[int, int]


def thp_mode(text: str | None = None) -> str | None:
    """The bracketed choice of the THP ``enabled`` file ("always", "madvise", "never")."""
    if text is None:
        try:
            with open(THP_ENABLED) as f:
                text = f.read()
        except OSError:
            return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def anon_ranges(maps: Iterable[str]) -> list[Range]:
    """Private writable anonymous mappings in /proc/<pid>/maps lines (no path, no [heap])."""
    out = []
    for line in maps:
        f = line.split()
        if len(f) == 5 and f[1] == "rw-p":
            lo, hi = f[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def subtract(after: Sequence[Range], before: Sequence[Range]) -> list[Range]:
    """The parts of ``after`` no range of ``before`` covers (a mapping that grew or merged
    with a neighbour shows up as its new part only)."""
    out = []
    olds = sorted(before)
    for lo, hi in sorted(after):
        cur = lo
        for a, b in olds:
            if b <= cur or a >= hi:
                continue
            if a > cur:
                out.append((cur, a))
            cur = max(cur, b)
            if cur >= hi:
                break
        if cur < hi:
            out.append((cur, hi))
    return out


def blocks(ranges: Sequence[Range], min_bytes: int = MIN_RANGE) -> list[Range]:
    """Each range of at least ``min_bytes``, shrunk inward to whole huge-page blocks."""
    out = []
    for lo, hi in ranges:
        if hi - lo < min_bytes:
            continue
        a, b = (lo + BLOCK - 1) // BLOCK * BLOCK, hi // BLOCK * BLOCK
        if b > a:
            out.append((a, b))
    return out


def available() -> bool:
    """Whether :class:`Advice` can put memory on huge pages here."""
    return (sys.platform == "linux" and os.environ.get("EDGESPEC_HUGE_PAGES", "1") != "0"
            and thp_mode() in ("madvise", "always"))


_libc = None


def _madvise(lo: int, n: int, advice: int) -> bool:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise(lo, n, advice) == 0


def _read_maps() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return f.readlines()
    except OSError:
        return []


class Advice:
    """Huge pages for what llama.cpp maps between construction and :meth:`mark`."""

    def __init__(self) -> None:
        self.on = available()
        self._before = anon_ranges(_read_maps()) if self.on else []
        self._marked: list[Range] = []

    def mark(self) -> int:
        """Mark the ranges mapped since construction (or the last mark) MADV_HUGEPAGE;
        pages faulted after this come huge. Returns the bytes marked."""
        if not self.on:
            return 0
        now = anon_ranges(_read_maps())
        new = blocks(subtract(now, self._before))
        self._before = now
        done = [(a, b) for a, b in new if _madvise(a, b - a, MADV_HUGEPAGE)]
        self._marked += done
        return sum(b - a for a, b in done)

    def collapse(self) -> int:
        """Collapse the marked blocks already populated with small pages; the bytes that
        are huge now. Unpopulated blocks fail fast and stay as they are."""
        n = 0
        for a, b in self._marked:
            for x in range(a, b, BLOCK):
                n += BLOCK if _madvise(x, BLOCK, MADV_COLLAPSE) else 0
        return n
