"""The native prompt-lookup index against its definition (native_reference.ngram_propose)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_reference import ngram_propose
from native_strategies import chunked, stream

from edgespec import _native
from edgespec.errors import InvalidInputError
from edgespec.runtime.native import MAX_DRAFT, CapacityError
from edgespec.proposers._native_types import NgramIndex


def test_worked_example():
    ix = NgramIndex(min_n=1, max_n=3)
    ix.extend([1, 2, 3, 4, 1, 2])
    s = ix.propose(6)
    # "4 1 2" is new, "1 2" ended at index 2: continue 3 4 1 2, then wrap onto the draft
    assert s.tokens == (3, 4, 1, 2, 3, 4)
    assert s.match_length == 2 and s.source == "ngram" and s.probs is None


def test_most_recent_occurrence_wins():
    ix = NgramIndex(min_n=1, max_n=1)
    ix.extend([7, 1, 7, 2, 7])
    assert ix.propose(1).tokens == (2,)


def test_longest_order_first():
    ix = NgramIndex(min_n=1, max_n=3)
    ix.extend([5, 1, 9, 6, 5, 1, 8, 6, 5, 1])
    # "6 5 1" occurred (ending at 6) and is longer than "5 1" at 2... both end at 6 here,
    # "1" alone would say 8 too; check the order reported
    s = ix.propose(2)
    assert s.match_length == 3 and s.tokens == (8, 6)


def test_repetition_drafts_full_k():
    ix = NgramIndex(min_n=2, max_n=4)
    ix.extend([3, 3, 3])
    assert ix.propose(10).tokens == (3,) * 10


def test_no_match_and_degenerate_streams():
    ix = NgramIndex(min_n=2, max_n=4)
    assert ix.propose(5).tokens == ()
    ix.extend([1])
    assert ix.propose(5).tokens == ()
    ix.extend([2, 3, 4])
    assert len(ix.propose(5)) == 0
    assert ix.propose(0).tokens == ()
    ix.check(deep=True)


@settings(max_examples=150, deadline=None)
@given(tokens=stream(), min_n=st.integers(1, 4), span=st.integers(0, 4), k=st.integers(0, 12),
       cuts=st.lists(st.integers(0, 200), max_size=6))
def test_matches_reference_incrementally(tokens, min_n, span, k, cuts):
    max_n = min_n + span
    ix = NgramIndex(min_n=min_n, max_n=max_n)
    seen: list[int] = []
    for part in chunked(tokens, cuts):
        ix.extend(part)
        seen += part
        want_toks, want_n = ngram_propose(seen, min_n, max_n, k)
        got = ix.propose(k)
        assert list(got.tokens) == want_toks
        assert got.match_length == want_n
    assert len(ix) == len(tokens)
    ix.check(deep=True)


@settings(max_examples=30, deadline=None)
@given(tokens=stream(400))
def test_every_prefix_matches_reference(tokens):
    ix = NgramIndex(min_n=1, max_n=4)
    for i, t in enumerate(tokens):
        ix.extend([t])
        assert list(ix.propose(5).tokens) == ngram_propose(tokens[:i + 1], 1, 4, 5)[0]


def test_large_token_ids_and_long_stream():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**31 - 1, size=3000, dtype=np.int64)
    stream_ = np.concatenate([base, base[:50]])
    ix = NgramIndex(min_n=2, max_n=8)
    ix.extend(stream_)  # int64 array: validated and converted
    s = ix.propose(4)
    assert s.match_length == 8 and list(s.tokens) == base[50:54].tolist()
    ix.check(deep=True)


# --- bad input ---------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    [1, -1],
    [2**31],
    [1.5],
    ["a"],
    np.array([1.0, 2.0]),
    np.array([[1, 2]], dtype=np.int32),
    np.array([-3], dtype=np.int64),
    np.array([2**40], dtype=np.int64),
    "text",
    b"\x01\x00\x00\x00",
    5,
])
def test_bad_tokens_raise_and_change_nothing(bad):
    ix = NgramIndex(min_n=1, max_n=2)
    ix.extend([1, 2, 1])
    with pytest.raises(InvalidInputError):
        ix.extend(bad)
    assert len(ix) == 3
    assert ix.propose(2).tokens == (2, 1)
    ix.check(deep=True)


def test_binding_rejects_wrong_buffers():
    raw = _native.NgramIndex(1, 2, 1 << 20)
    with pytest.raises(TypeError):
        raw.extend(np.arange(4, dtype=np.int64))
    with pytest.raises(TypeError):
        raw.extend(np.arange(4, dtype=np.uint32))
    with pytest.raises(ValueError):
        raw.extend(np.arange(8, dtype=np.int32)[::2])  # not contiguous
    with pytest.raises(ValueError):
        raw.extend(np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError):
        raw.extend(np.array([0, -5], dtype=np.int32))  # the C library refuses the range
    raw.extend(memoryview(np.arange(4, dtype=np.int32)))  # any int32 buffer is fine
    raw.extend(np.arange(8, dtype=np.int32)[::2].copy())
    assert len(raw) == 8


@pytest.mark.parametrize("kw", [dict(min_n=0), dict(min_n=3, max_n=2), dict(max_n=65),
                                dict(max_bytes=0), dict(max_bytes=100), dict(min_n=1.5)])
def test_bad_configuration(kw):
    with pytest.raises(InvalidInputError):
        NgramIndex(**kw)


@pytest.mark.parametrize("k", [-1, MAX_DRAFT + 1])
def test_bad_k(k):
    with pytest.raises(InvalidInputError):
        NgramIndex().propose(k)
    with pytest.raises(ValueError):
        _native.NgramIndex(1, 2, 1 << 20).propose(k)


def test_uninitialised_object_raises():
    raw = _native.NgramIndex.__new__(_native.NgramIndex)
    with pytest.raises(RuntimeError):
        raw.propose(1)


# --- memory ------------------------------------------------------------------------

def test_hard_cap_keeps_a_consistent_prefix():
    cap = 200_000
    ix = NgramIndex(min_n=1, max_n=4, max_bytes=cap)
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 1000, size=100_000).astype(np.int32)
    with pytest.raises(CapacityError):
        ix.extend(toks)
    assert 0 < len(ix) < len(toks)
    assert ix.memory_usage() <= cap
    ix.check(deep=True)
    n = len(ix)
    assert list(ix.propose(3).tokens) == ngram_propose(toks[:n].tolist(), 1, 4, 3)[0]


def test_memory_grows_linearly():
    ix = NgramIndex(min_n=2, max_n=5)
    rng = np.random.default_rng(2)
    ix.extend(rng.integers(0, 50_000, size=10_000).astype(np.int32))
    small = ix.memory_usage()
    ix.extend(rng.integers(0, 50_000, size=30_000).astype(np.int32))
    # 4 orders per token: at most ~2 slots of 16 bytes each after doubling, plus the stream
    assert ix.memory_usage() <= 40_000 * (4 * 2 * 16 * 2 + 4 * 2) + 64_000
    assert ix.memory_usage() > small


def test_allocation_failures_never_corrupt():
    rng = np.random.default_rng(3)
    toks = rng.integers(0, 30, size=3000).astype(np.int32)
    for n in range(0, 12):
        try:
            _native._fail_alloc_after(n)
            try:
                ix = NgramIndex(min_n=1, max_n=3)
            except MemoryError:
                continue
            try:
                ix.extend(toks)
            except MemoryError:
                pass
        finally:
            _native._fail_alloc_after(-1)
        ix.check(deep=True)
        k = len(ix)
        assert list(ix.propose(4).tokens) == ngram_propose(toks[:k].tolist(), 1, 3, 4)[0]
        ix.extend(toks[:10])  # still usable
        ix.check()


def test_failed_conversions_do_not_leak():
    """Regression: a long list with a bad item used to leak its copy."""
    import tracemalloc
    raw = _native.NgramIndex(1, 2, 1 << 20)
    bad = [0] * 500 + ["x"]
    for _ in range(50):  # warm-up: exception machinery, caches
        with pytest.raises(TypeError):
            raw.extend(bad)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(2000):
        with pytest.raises(TypeError):
            raw.extend(bad)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 100_000, grown  # a leak would be 2000 * 2 KB
