"""The native suffix trees and speculation against their definition (native_reference)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_reference import longest_match
from native_reference import speculate as ref_speculate
from native_strategies import chunked, random_stream, repetitive_stream, stream

from edgespec import _native
from edgespec.errors import InvalidInputError
from edgespec.runtime.native import CapacityError
from edgespec.proposers._native_types import SuffixCursor, SuffixTree, speculate
from edgespec.proposers.base import Draft

params = st.fixed_dictionaries({
    "max_tokens": st.integers(0, 12),
    "factor": st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.7]),
    "offset": st.sampled_from([-2.0, 0.0, 1.0, 4.5]),
    "min_prob": st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
})


def as_tuple(s: Draft):
    src = {"": 0, "request": 1, "global": 2}[s.source]
    return (s.tokens, s.confidence or (), s.match_length, s.score, src)


def request_tree(tokens, depth, cap=1 << 24):
    t = SuffixTree(depth, cap)
    t.begin()
    t.extend(tokens)
    return t


# --- literal examples ----------------------------------------------------------------

def test_worked_example_request_tree():
    t = request_tree([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], 8)
    # "1 2" occurred twice before, both times followed by 3 (p = 2/2), then 4 or 5
    # (1 each: the tie goes to the lower id, p = 1/2); factor 1 * match 2 = 2 tokens
    s = speculate(t, None, 8, factor=1.0, offset=0.0, min_prob=0.0)
    assert s == Draft((3, 4), confidence=(1.0, 0.5), match_length=2, score=1.5, source="request")
    s = speculate(t, None, 8, factor=1.0, offset=2.0, min_prob=0.0)
    assert s.tokens == (3, 4, 1, 2) and s.confidence == (1.0, 0.5, 0.5, 0.5) and s.score == 2.5
    # min_prob stops before the first token below it
    assert speculate(t, None, 8, 1.0, 2.0, min_prob=0.6).tokens == (3,)
    t.check(deep=True)


def test_worked_example_global_tree_and_tie_to_request():
    g = SuffixTree(8, 1 << 22)
    g.add([7, 8, 9, 7, 8, 10])
    g.add([1, 2, 3, 9])
    c = SuffixCursor(g)
    c.extend([5, 1, 2])
    assert c.match_length() == 2
    s = speculate(None, c, 8, factor=1.0, offset=2.0, min_prob=0.0)
    assert s == Draft((3, 9), confidence=(1.0, 1.0), match_length=2, score=2.0, source="global")
    # the request tree's (3, 4) scores 1.5 and loses to the global (3, 9) at 2.0 ...
    t = request_tree([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], 8)
    assert speculate(t, c, 8, 1.0, 0.0, 0.0).tokens == (3, 9)
    # ... while a tie goes to the request tree
    t = request_tree([1, 2, 3, 1, 1, 2], 8)
    s = speculate(t, c, 8, 1.0, 0.0, 0.0)
    assert s == Draft((3, 1), confidence=(1.0, 1.0), match_length=2, score=2.0, source="request")
    g.check(deep=True)


def test_global_counts_give_probabilities():
    g = SuffixTree(4, 1 << 22)
    for tail in ([5], [5], [6], [5]):
        g.add([1, 2] + tail)
    c = SuffixCursor(g)
    c.extend([9, 1, 2])
    s = speculate(None, c, 4, factor=1.0, offset=0.0, min_prob=0.0)
    assert s.tokens == (5,) and s.confidence == (0.75,) and s.match_length == 2


def test_eviction_forgets_the_oldest():
    g = SuffixTree(4, 1 << 22)
    g.add([1, 2, 3])
    g.add([1, 2, 4])
    g.add([1, 2, 4])
    g.evict_oldest()
    assert [s.tolist() for s in g.sequences()] == [[1, 2, 4], [1, 2, 4]]
    c = SuffixCursor(g)
    c.extend([1, 2])
    assert speculate(None, c, 3, 1.0, 1.0, 0.0).tokens == (4,)
    g.evict_oldest()
    g.evict_oldest()
    assert g.num_tokens == 0 and g.num_nodes == 1 and g.num_sequences == 0
    assert speculate(None, c, 3, 1.0, 1.0, 0.0).tokens == ()
    g.check(deep=True)


def test_empty_and_tiny():
    t = SuffixTree(2, 1 << 20)
    assert speculate(t, None, 4).tokens == ()  # no open sequence
    t.begin()
    assert speculate(t, None, 4).tokens == ()
    t.extend([3])
    t.extend([3])
    t.extend([3])
    # depth 2: "3" occurred twice before, always followed by 3; depth 2 ends the path
    assert speculate(t, None, 4, 1.0, 5.0, 0.0) == Draft((3,), confidence=(1.0,), match_length=1,
                                                         score=1.0, source="request")
    t.check(deep=True)
    assert speculate(t, None, 0).tokens == ()


# --- differential ---------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(tokens=stream(90), depth=st.integers(2, 9), p=params,
       cuts=st.lists(st.integers(0, 200), max_size=5))
def test_request_tree_matches_reference(tokens, depth, p, cuts):
    t = SuffixTree(depth, 1 << 24)
    t.begin()
    seen: list[int] = []
    for part in chunked(tokens, cuts):
        t.extend(part)
        seen += part
        got = speculate(t, None, **p)
        want = ref_speculate(seen, None, seen, depth, **p)
        assert as_tuple(got) == want
    t.check(deep=True)
    assert t.num_tokens == len(tokens)


@settings(max_examples=120, deadline=None)
@given(seqs=st.lists(stream(40), max_size=6), context=stream(30), depth=st.integers(2, 9),
       p=params, evict=st.integers(0, 6), cursor_first=st.booleans(),
       cuts=st.lists(st.integers(0, 100), max_size=4))
def test_global_tree_matches_reference(seqs, context, depth, p, evict, cursor_first, cuts):
    g = SuffixTree(depth, 1 << 24)
    c = SuffixCursor(g) if cursor_first else None
    if c is not None:
        c.extend(context[: len(context) // 2])  # goes stale as sequences arrive
    for s in seqs:
        g.add(s)
    for _ in range(min(evict, len(seqs))):
        g.evict_oldest()
    live = seqs[min(evict, len(seqs)):]
    assert [s.tolist() for s in g.sequences()] == live
    g.check(deep=True)
    if c is None:
        c = SuffixCursor(g)
        parts = chunked(context, cuts)
    else:
        parts = chunked(context[len(context) // 2:], cuts)
        seen = context[: len(context) // 2]
    seen = [] if not cursor_first else seen
    for part in parts:
        c.extend(part)
        seen += part
        assert c.match_length() == longest_match(live, seen, depth)
        assert as_tuple(speculate(None, c, **p)) == ref_speculate(None, live, seen, depth, **p)


@settings(max_examples=80, deadline=None)
@given(seqs=st.lists(repetitive_stream(40, vocab=8), max_size=4), prompt=stream(40),
       output=stream(30), depth=st.integers(2, 8), p=params,
       cuts=st.lists(st.integers(0, 100), max_size=4))
def test_request_and_global_together(seqs, prompt, output, depth, p, cuts):
    g = SuffixTree(depth, 1 << 24)
    for s in seqs:
        g.add(s)
    t = request_tree(prompt, depth)
    c = SuffixCursor(g)
    c.extend(prompt)
    seen = list(prompt)
    for part in [[]] + chunked(output, cuts):
        t.extend(part)
        c.extend(part)
        seen += part
        assert as_tuple(speculate(t, c, **p)) == ref_speculate(seen, seqs, seen, depth, **p)


@settings(max_examples=25, deadline=None)
@given(seqs=st.lists(stream(60), min_size=1, max_size=12), depth=st.integers(2, 12),
       order=st.lists(st.booleans(), max_size=30))
def test_interleaved_adds_and_evictions_keep_invariants(seqs, depth, order):
    g = SuffixTree(depth, 1 << 24)
    live: list[list[int]] = []
    it = iter(seqs)
    for add in order + [True] * len(seqs):
        if add:
            s = next(it, None)
            if s is None:
                break
            g.add(s)
            live.append(s)
        elif live:
            g.evict_oldest()
            live.pop(0)
        g.check(deep=True)
    assert [s.tolist() for s in g.sequences()] == live
    assert g.num_tokens == sum(map(len, live))


def test_long_repetitive_and_random_streams_check_deep():
    rng = np.random.default_rng(5)
    phrase = rng.integers(0, 40, size=23)
    rep = np.concatenate([phrase] * 40 + [rng.integers(0, 40, size=300)])
    for toks, depth in ((rep, 16), (rng.integers(0, 3, size=2000), 24),
                        (rng.integers(0, 100_000, size=3000), 64)):
        t = request_tree(toks.astype(np.int32), depth)
        t.check(deep=True)
        s = speculate(t, None, 16, 1.0, 0.0, 0.1)
        assert len(s) <= 16
    # a long exact repeat drafts the full cap with certainty
    t = request_tree(np.concatenate([phrase] * 10).astype(np.int32), 32)
    s = speculate(t, None, 16, 1.0, 0.0, 0.1)
    assert len(s) == 16 and s.confidence == (1.0,) * 16


# --- memory caps ------------------------------------------------------------------------

def test_global_cap_evicts_oldest_and_holds():
    cap = 400_000
    g = SuffixTree(16, cap)
    rng = np.random.default_rng(6)
    added = [rng.integers(0, 500, size=int(rng.integers(50, 400))).astype(np.int32)
             for _ in range(200)]
    for s in added:
        g.add(s)
        assert g.memory_usage() <= cap
    kept = g.sequences()
    assert 0 < len(kept) < len(added)
    for a, b in zip(kept, added[-len(kept):]):  # exactly the newest ones survive
        assert np.array_equal(a, b)
    g.check(deep=True)


def test_request_cap_raises_and_stays_consistent():
    cap = 150_000
    t = SuffixTree(32, cap)
    t.begin()
    rng = np.random.default_rng(7)
    toks = rng.integers(0, 1000, size=50_000).astype(np.int32)
    with pytest.raises(CapacityError):
        t.extend(toks)
    assert 0 < t.num_tokens < len(toks)
    assert t.memory_usage() <= cap
    t.check(deep=True)


def test_sequence_larger_than_cap_keeps_a_prefix():
    g = SuffixTree(8, 120_000)
    with pytest.raises(CapacityError):
        g.add(np.arange(100_000, dtype=np.int32))
    assert g.num_sequences == 1 and 0 < g.num_tokens < 100_000
    g.add([1, 2, 3])  # evicts the partial one when it needs room
    g.check(deep=True)


def test_memory_usage_linear_in_tokens():
    rng = np.random.default_rng(8)
    t = request_tree(rng.integers(0, 50_000, size=20_000).astype(np.int32), 64, 1 << 28)
    per_token = t.memory_usage() / t.num_tokens
    assert per_token < 400, per_token
    assert t.num_nodes < 3 * t.num_tokens


def test_allocation_failures_never_corrupt():
    rng = np.random.default_rng(9)
    seqs = [rng.integers(0, 12, size=300).astype(np.int32) for _ in range(4)]
    failures = 0
    for n in range(0, 40):
        g = SuffixTree(8, 1 << 24)
        g.add(seqs[1][:50])
        c = SuffixCursor(g)
        c.extend(seqs[1][:10])  # live locations, which a failed add must invalidate
        try:
            _native._fail_alloc_after(n)
            for s in seqs:
                try:
                    g.add(s)
                except MemoryError:
                    failures += 1
            try:
                t = SuffixTree(8, 1 << 24)
                t.begin()
                t.extend(seqs[0])
            except MemoryError:
                failures += 1
                t = None
        finally:
            _native._fail_alloc_after(-1)
        g.check(deep=True)
        if t is not None:
            t.check(deep=True)
        live = [x.tolist() for x in g.sequences()]
        ctx = seqs[1][:10].tolist()
        assert as_tuple(speculate(None, c, 8, 1.0, 2.0, 0.0)) == ref_speculate(
            None, live, ctx, 8, 8, 1.0, 2.0, 0.0)
        c.extend(seqs[1][10:20])
        speculate(t, c, 8)
    assert failures > 10


# --- bad input and state ----------------------------------------------------------------

def test_bad_tokens_and_states():
    t = SuffixTree(8, 1 << 20)
    with pytest.raises(_native.StateError):
        t.extend([1, 2])  # nothing open
    with pytest.raises(_native.StateError):
        t.evict_oldest()
    t.begin()
    t.extend([1, 2, 3])
    for bad in ([1, -2], [2**31], np.array([1.5]), "abc", np.zeros((2, 2), np.int32)):
        with pytest.raises(InvalidInputError):
            t.extend(bad)
    assert t.num_tokens == 3
    with pytest.raises(_native.StateError):
        t.evict_oldest()  # the only sequence is open
    with pytest.raises(IndexError):
        t._t.sequence(5)
    c = SuffixCursor(t)
    with pytest.raises(InvalidInputError):
        c.extend([-1])
    t.check(deep=True)


@pytest.mark.parametrize("kw", [dict(max_tokens=-1), dict(max_tokens=10_000), dict(factor=-1.0),
                                dict(factor=float("nan")), dict(offset=float("inf")),
                                dict(min_prob=1.5), dict(min_prob=-0.1)])
def test_bad_speculation_parameters(kw):
    args = dict(max_tokens=4, factor=1.0, offset=0.0, min_prob=0.1) | kw
    t = request_tree([1, 2, 1, 2], 4)
    with pytest.raises(InvalidInputError):
        speculate(t, None, **args)
    with pytest.raises((ValueError, TypeError)):
        _native.speculate(t._t, None, args["max_tokens"], args["factor"], args["offset"],
                          args["min_prob"])


def test_speculate_argument_types():
    with pytest.raises(TypeError):
        _native.speculate("tree", None, 4, 1.0, 0.0, 0.1)
    with pytest.raises(TypeError):
        _native.speculate(None, object(), 4, 1.0, 0.0, 0.1)
    assert _native.speculate(None, None, 4, 1.0, 0.0, 0.1) == ((), (), 0, 0.0, 0)


@pytest.mark.parametrize("kw", [dict(max_depth=1), dict(max_depth=5000), dict(max_bytes=10),
                                dict(max_depth=2.5)])
def test_bad_tree_configuration(kw):
    with pytest.raises(InvalidInputError):
        SuffixTree(**kw)


# --- threads --------------------------------------------------------------------------

def test_concurrent_use_is_serialised():
    """Large extends release the GIL; the per-tree lock keeps other callers out."""
    g = SuffixTree(32, 1 << 26)
    rng = np.random.default_rng(10)
    big = [rng.integers(0, 200, size=20_000).astype(np.int32) for _ in range(4)]
    c = SuffixCursor(g)
    c.extend(big[0][:100])
    errors: list[BaseException] = []

    def writer(arr):
        try:
            g.add(arr)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    def reader():
        try:
            for _ in range(300):
                speculate(None, c, 8)
                c.extend([int(rng.integers(0, 200))])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(a,)) for a in big]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert g.num_sequences == 4
    g.check(deep=True)


@settings(max_examples=60, deadline=None)
@given(closed=st.lists(stream(30), max_size=3), growing=stream(60), context=stream(20),
       depth=st.integers(2, 8), p=params, cuts=st.lists(st.integers(0, 100), max_size=4))
def test_cursor_over_a_tree_with_an_open_sequence(closed, growing, context, depth, p, cuts):
    """Cursors read open leaves (implicit lengths) correctly and never trust
    locations across a change of the tree."""
    g = SuffixTree(depth, 1 << 24)
    for s in closed:
        g.add(s)
    g.begin()
    c = SuffixCursor(g)
    c.extend(context)
    grown: list[int] = []
    for part in chunked(growing, cuts):
        c.match_length()  # sync the cursor to the tree as it is
        g.extend(part)
        grown += part
        assert as_tuple(speculate(None, c, **p)) == ref_speculate(None, closed + [grown], context,
                                                                  depth, **p)
    g.check(deep=True)


def test_cursor_resyncs_after_a_failed_extend():
    rng = np.random.default_rng(11)
    toks = rng.integers(0, 5, size=400).astype(np.int32)
    for n in range(0, 12):
        g = SuffixTree(6, 1 << 24)
        g.begin()
        g.extend(toks[:100])
        c = SuffixCursor(g)
        c.extend(toks[100:110])
        c.match_length()
        try:
            _native._fail_alloc_after(n)
            try:
                g.extend(toks[100:])
            except MemoryError:
                pass
        finally:
            _native._fail_alloc_after(-1)
        g.check(deep=True)
        live = [x.tolist() for x in g.sequences()]
        assert as_tuple(speculate(None, c, 8, 1.0, 2.0, 0.0)) == ref_speculate(
            None, live, toks[100:110].tolist(), 6, 8, 1.0, 2.0, 0.0)
