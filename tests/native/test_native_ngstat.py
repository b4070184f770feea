"""The native n-gram statistics and their drafting against their definition (native_reference)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_reference import StatsModel, stats_draft
from native_strategies import chunked, stream

from edgespec import _native
from edgespec.errors import InvalidInputError
from edgespec.runtime.native import NGSTAT_RECORD
from edgespec.proposers._native_types import DraftBar, NgramStats, ngram_draft
from edgespec.proposers.base import Draft

LAX = DraftBar(order_extra=[0], context_counts=[1], context_shares=[0.0], dynamic_counts=[1],
               dynamic_shares=[0.0])


def stats(tokens, min_n=1, max_n=3, cap=1 << 24):
    s = NgramStats(min_n, max_n, cap)
    s.extend(tokens)
    return s


def draft_params(**kw):
    """DraftBar arguments as lists, for both the native and the reference call."""
    d = dict(order_extra=[0], context_counts=[1], context_shares=[0.0], dynamic_counts=[1],
             dynamic_shares=[0.0])
    d.update(kw)
    return d


def ref_draft(ctx, dyn, k, p):
    return stats_draft(ctx, dyn, k, p["order_extra"],
                       ((p["context_counts"], p["context_shares"]),
                        (p["dynamic_counts"], p["dynamic_shares"])))


def as_tuple(d: Draft):
    src = {"": 0, "context": 3, "dynamic": 4}[d.source]
    return (d.tokens, d.confidence or (), d.match_length, d.score, src)


# --- literal examples ----------------------------------------------------------------

def test_worked_example():
    s = stats([1, 2, 3, 1, 2, 4, 1, 2])
    # "1 2" was followed by 3 once and by 4 once: 2 samples, the tie to the lower id
    assert s.lookup([1, 2]) == (2, 3, 1)
    assert s.count([1, 2], 4) == 1 and s.count([1, 2], 9) == 0
    assert s.lookup([9]) is None and s.lookup([1, 2, 3, 1]) is None  # order 4 > max_n
    # a bar of 50%: "1 2" -> 3 at share 0.5; then "1 2 3" -> 1, "2 3 1" -> 2 and
    # "3 1 2" -> 4, each seen once (share 1): the running product stays at 0.5
    d = ngram_draft(s, None, 4, DraftBar([0], [1], [0.5], [1], [0.5]))
    assert d == Draft((3, 1, 2, 4), confidence=(0.5, 1.0, 1.0, 1.0), match_length=2,
                      score=0.5 * 4, source="context")
    # a bar of 60% refuses the 50/50 split, and the shorter n-gram "2" (followed by
    # 3 once and 4 once) is no better: nothing to draft
    assert ngram_draft(s, None, 4, DraftBar([0], [1], [0.6], [1], [0.6])) == Draft(())
    s.check(deep=True)


def test_bar_depends_on_position_and_order():
    s = stats([5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6])
    # "5 6" -> 7 twice, 8 once: share 2/3 passes 0.5 at position 0
    assert ngram_draft(s, None, 1, DraftBar([0], [1], [0.5], [1], [0.5])).tokens == (7,)
    # then "6 7" -> 5 (2/2) passes a rising bar, "7 5" -> 6 (2/2) too ...
    d = ngram_draft(s, None, 8, DraftBar([0], [1], [0.5, 0.9], [1], [1.0]))
    assert d.tokens[:3] == (7, 5, 6) and d.confidence[:3] == (2 / 3, 1.0, 1.0)
    # ... until "5 6" comes round again at position 3, where 2/3 < 0.9: the draft stops
    assert len(d) == 3
    # more samples per position: position 0 needs 4, "5 6" has 3, "6" has 3
    assert len(ngram_draft(s, None, 4, DraftBar([0], [4], [0.0], [9], [0.0]))) == 0
    # an order needing extra samples: order 2 needs 1 + 2 = 3 (has 3), order 3 is unseen
    assert ngram_draft(s, None, 1, DraftBar([0, 5, 2, 0], [1], [0.0], [9], [0.0])).match_length == 2


def test_dynamic_table_is_consulted_after_the_context():
    ctx = stats([1, 2, 3])
    dyn = NgramStats(1, 3, 1 << 20)
    for _ in range(3):
        dyn.begin([0])
        dyn.extend([2, 3, 9, 9])
    # the context knows nothing after "3"; the dynamic table saw "2 3" -> 9 three times
    d = ngram_draft(ctx, dyn, 2, DraftBar([0], [1], [0.5], [3], [0.66]))
    assert d.tokens == (9, 9) and d.source == "dynamic" and d.match_length == 2
    # a stricter dynamic bar refuses it
    assert len(ngram_draft(ctx, dyn, 2, DraftBar([0], [1], [0.5], [4], [0.66]))) == 0
    # begin() made "0" the history: n-grams reach back into it, but it was never
    # counted as a continuation itself
    assert dyn.lookup([0]) == (3, 2, 3) and dyn.lookup([0, 2]) == (3, 3, 3)
    assert all(r[1] != 0 for r in dyn.records())


def test_decay_halves_and_forgets():
    s = stats([1, 2, 1, 2, 1, 3], max_n=1)
    assert s.lookup([1]) == (3, 2, 2)
    s.decay()
    # 2 x2 -> 1; 3 x1 -> 0 (forgotten); "2" -> 1 x2 -> 1
    assert s.lookup([1]) == (1, 2, 1) and s.count([1], 3) == 0
    s.decay()
    assert s.lookup([1]) is None and s.num_ngrams == 0 and s.num_pairs == 0
    s.check(deep=True)
    s.extend([4, 4])  # still usable, and the history survived: "3" -> 4, "4" -> 4
    assert s.lookup([3]) == (1, 4, 1) and s.lookup([4]) == (1, 4, 1)


def test_budget_decays_instead_of_failing():
    rng = np.random.default_rng(1)
    s = NgramStats(1, 4, 64 << 10)
    toks = rng.integers(0, 5000, size=20_000).astype(np.int32)
    s.extend(toks)  # far more distinct n-grams than 64 KiB holds
    assert s.memory_usage() <= 64 << 10 and s.decays > 0
    s.check(deep=True)
    # what survives is consistent, and repeated evidence still drafts
    s.extend([7, 8, 9] * 20)
    assert ngram_draft(s, None, 3, LAX).tokens == (7, 8, 9)


def test_records_round_trip_and_validation():
    s = stats([1, 2, 3, 1, 2, 3, 1, 4], max_n=3)
    rec = s.records()
    assert rec.shape == (s.num_pairs, NGSTAT_RECORD) and rec.dtype == np.int32
    t = NgramStats(1, 3, 1 << 20)
    t.add_records(rec)
    t.add_records(rec)  # counts add up
    for g in ([1], [1, 2], [2, 3, 1], [3, 1]):
        total, best, bc = s.lookup(g)
        assert t.lookup(g) == (2 * total, best, 2 * bc)
    t.check(deep=True)
    # a table of other orders keeps the records it can use
    u = NgramStats(2, 2, 1 << 20)
    u.add_records(rec)
    assert u.lookup([1, 2]) == s.lookup([1, 2]) and u.lookup([1]) is None
    # a bad record anywhere refuses the whole batch, changing nothing
    before = t.records()
    for col, value in ((0, 0), (0, 99), (1, -1), (2, 0), (3, -5)):
        bad = rec.copy()
        bad[-1, col] = value
        with pytest.raises(InvalidInputError):
            t.add_records(bad)
        assert np.array_equal(t.records(), before)
    with pytest.raises(InvalidInputError):
        t.add_records(rec[:, :5])


def test_counts_are_clamped_and_saturate_by_decaying():
    s = NgramStats(1, 1, 1 << 20)
    big = np.zeros((1, NGSTAT_RECORD), np.int32)
    big[0, :4] = (1, 7, 2**31 - 1, 5)  # order 1, "5" -> 7, an absurd count
    s.add_records(big)
    assert s.lookup([5]) == (_native.NGSTAT_COUNT_MAX,) + (7, _native.NGSTAT_COUNT_MAX)
    s.begin([5])
    s.extend([8])  # one more sample would pass the ceiling: the table decays first
    assert s.decays == 1 and s.lookup([5]) == (_native.NGSTAT_COUNT_MAX // 2 + 1, 7,
                                               _native.NGSTAT_COUNT_MAX // 2)
    s.check(deep=True)


def test_bad_arguments():
    with pytest.raises(InvalidInputError):
        NgramStats(0, 2)
    with pytest.raises(InvalidInputError):
        NgramStats(3, 9)
    with pytest.raises(InvalidInputError):
        NgramStats(1, 2, 1000)  # below the smallest tables
    s = stats([1, 2, 3])
    for gram in ([], list(range(9)), [-1], ["x"]):
        with pytest.raises(InvalidInputError):
            s.lookup(gram)
    with pytest.raises(InvalidInputError):
        s.extend([1, -2])
    with pytest.raises(InvalidInputError):
        s.begin([2**40])
    for kw in (dict(context_shares=[1.5]), dict(dynamic_counts=[0]), dict(order_extra=[-1]),
               dict(context_counts=[]), dict(context_counts=[1] * 9), dict(context_shares=["a"])):
        with pytest.raises(InvalidInputError):
            DraftBar(**draft_params(**kw))
    with pytest.raises(InvalidInputError):
        ngram_draft(s, None, 10_000, LAX)
    with pytest.raises(TypeError):
        _native.ngram_draft(s._s, None, 4, b"not params")
    with pytest.raises(RuntimeError):
        _native.NgramStats.__new__(_native.NgramStats).extend([1])
    assert ngram_draft(None, None, 4, LAX) == Draft(())


def test_allocation_failures_never_corrupt():
    toks = np.random.default_rng(2).integers(0, 40, size=4000).astype(np.int32)
    for n in range(0, 14):
        try:
            _native._fail_alloc_after(n)
            try:
                s = NgramStats(1, 4, 1 << 24)
            except MemoryError:
                continue
            try:
                s.extend(toks)
            except MemoryError:
                pass
        finally:
            _native._fail_alloc_after(-1)
        s.check(deep=True)
        s.extend(toks[:50])  # still usable
        s.check()


# --- differential ---------------------------------------------------------------------

bars = st.fixed_dictionaries({
    "order_extra": st.lists(st.integers(0, 2), min_size=1, max_size=9),
    "context_counts": st.lists(st.integers(1, 3), min_size=1, max_size=8),
    "context_shares": st.lists(st.sampled_from([0.0, 0.3, 0.5, 2 / 3, 1.0]), min_size=1, max_size=8),
    "dynamic_counts": st.lists(st.integers(1, 3), min_size=1, max_size=8),
    "dynamic_shares": st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=8),
})


@settings(max_examples=150, deadline=None)
@given(seqs=st.lists(st.tuples(stream(8), stream(60)), min_size=1, max_size=4),
       orders=st.tuples(st.integers(1, 4), st.integers(0, 4)), cuts=st.lists(st.integers(0, 99), max_size=4),
       p=bars, k=st.integers(0, 12), decays=st.integers(0, 2))
def test_matches_reference(seqs, orders, cuts, p, k, decays):
    lo, hi = orders[0], orders[0] + orders[1]
    s, ref = NgramStats(lo, min(hi, 8), 1 << 24), StatsModel(lo, min(hi, 8))
    for context, tokens in seqs:
        s.begin(context)
        ref.begin(context)
        for part in chunked(tokens, cuts):
            s.extend(part)
            ref.extend(part)
    for _ in range(decays):
        s.decay()
        ref.decay()
    s.check(deep=True)
    got = {(int(r[0]), int(r[1]), int(r[2]), tuple(int(x) for x in r[3:3 + r[0]])) for r in s.records()}
    assert got == ref.records()
    for g in list(ref.counts)[:30]:
        assert s.lookup(list(g)) == ref.lookup(g)
    assert as_tuple(ngram_draft(s, None, k, DraftBar(**p))) == ref_draft(ref, None, k, p)


@settings(max_examples=100, deadline=None)
@given(context=stream(80), earlier=st.lists(stream(40), max_size=3), p=bars, k=st.integers(1, 10))
def test_context_and_dynamic_match_reference(context, earlier, p, k):
    ctx, dyn = NgramStats(2, 4, 1 << 22), NgramStats(1, 3, 1 << 22)
    rctx, rdyn = StatsModel(2, 4), StatsModel(1, 3)
    for e in earlier:
        dyn.begin(e[:2])
        rdyn.begin(e[:2])
        dyn.extend(e[2:])
        rdyn.extend(e[2:])
    ctx.extend(context)
    rctx.extend(context)
    assert as_tuple(ngram_draft(ctx, dyn, k, DraftBar(**p))) == ref_draft(rctx, rdyn, k, p)
    assert as_tuple(ngram_draft(None, dyn, k, DraftBar(**p))) == ref_draft(None, rdyn, k, p)
