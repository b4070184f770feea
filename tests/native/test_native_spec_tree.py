"""Speculation trees (es_speculate_tree) against their definition (native_reference)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_reference import speculate_tree as ref_tree
from native_strategies import chunked, repetitive_stream, stream

from edgespec import _native
from edgespec.errors import InvalidInputError
from edgespec.proposers._native_types import SuffixCursor, SuffixTree, speculate, speculate_tree

params = st.fixed_dictionaries({
    "max_tokens": st.integers(0, 12),
    "factor": st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.7]),
    "offset": st.sampled_from([-2.0, 0.0, 1.0, 4.5]),
    "min_prob": st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
    "max_children": st.integers(1, 8),
})


def raw(request, cursor, p):
    return _native.speculate_tree(request._t if request is not None else None,
                                  cursor._c if cursor is not None else None, p["max_tokens"],
                                  p["factor"], p["offset"], p["min_prob"], p["max_children"])


def request_tree(tokens, depth):
    t = SuffixTree(depth, 1 << 24)
    t.begin()
    t.extend(tokens)
    return t


def test_worked_example_branches_where_the_request_did():
    # "1 2" was followed by "3 4 9 8" and by "3 5 9 7"; the context ends "7 1 2", so the
    # match is "1 2" (m = 2, depth budget factor 2 * 2 = 4): 3 is certain, then 4 and 5
    # are even (the tie takes the lower id first)
    t = request_tree([1, 2, 3, 4, 9, 8, 1, 2, 3, 5, 9, 7, 1, 2], 8)
    tree = speculate_tree(t, None, 8, factor=2.0, offset=0.0, min_prob=0.0, max_children=4)
    assert tree.tokens == (3, 4, 9, 8, 5, 9, 7)
    assert tree.parents == (-1, 0, 1, 2, 0, 4, 5)
    assert tree.confidence == (1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5)
    assert tree.source == "request" and tree.width == 2 and tree.depth == 4
    # the first branch is the linear draft
    linear = speculate(t, None, 8, 2.0, 0.0, 0.0)
    assert tree.path_tokens(tree.path(tree.leaves[0])) == linear.tokens
    # a node budget cuts the least probable nodes, ties to the later ones
    small = speculate_tree(t, None, 4, factor=2.0, offset=0.0, min_prob=0.0, max_children=4)
    assert small.tokens == (3, 4, 9, 5)


def test_one_child_per_node_is_the_linear_draft():
    t = request_tree([1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2, 3, 4, 7, 1, 2], 8)
    for k in range(0, 9):
        lin = speculate(t, None, k, 2.0, 0.0, 0.1)
        tree = speculate_tree(t, None, k, 2.0, 0.0, 0.1, max_children=1)
        assert tree.tokens == lin.tokens
        assert tree.confidence == (lin.confidence or ())
        assert tree.parents == tuple(range(-1, len(lin) - 1))


def test_bad_arguments_are_refused():
    t = request_tree([1, 2, 1], 4)
    with pytest.raises(InvalidInputError, match="max_children"):
        speculate_tree(t, None, 4, max_children=0)
    with pytest.raises(InvalidInputError, match="max_children"):
        speculate_tree(t, None, 4, max_children=_native.MAX_TREE_CHILDREN + 1)
    with pytest.raises(ValueError, match="max_children"):
        _native.speculate_tree(t._t, None, 4, 1.0, 0.0, 0.1, 99)
    with pytest.raises(ValueError, match="out of range"):
        _native.speculate_tree(t._t, None, 4, -1.0, 0.0, 0.1, 2)
    assert speculate_tree(None, None, 4).width == 0


@settings(max_examples=150, deadline=None)
@given(tokens=repetitive_stream(80, vocab=6), depth=st.integers(2, 9), p=params,
       cuts=st.lists(st.integers(0, 200), max_size=4))
def test_request_tree_matches_reference(tokens, depth, p, cuts):
    t = SuffixTree(depth, 1 << 24)
    t.begin()
    seen: list[int] = []
    for part in chunked(tokens, cuts):
        t.extend(part)
        seen += part
        assert raw(t, None, p) == ref_tree(seen, None, seen, depth, **p)


@settings(max_examples=100, deadline=None)
@given(seqs=st.lists(repetitive_stream(40, vocab=6), max_size=5), prompt=stream(30),
       output=repetitive_stream(20, vocab=6), depth=st.integers(2, 8), p=params,
       cuts=st.lists(st.integers(0, 100), max_size=3))
def test_request_and_global_together_match_reference(seqs, prompt, output, depth, p, cuts):
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
        assert raw(t, c, p) == ref_tree(seen, seqs, seen, depth, **p)
        assert raw(None, c, p) == ref_tree(None, seqs, seen, depth, **p)


@settings(max_examples=60, deadline=None)
@given(tokens=repetitive_stream(200, vocab=4), k=st.integers(1, 64), w=st.integers(1, 8))
def test_trees_are_prefix_closed_and_most_probable_first(tokens, k, w):
    t = request_tree(tokens, 16)
    toks, parents, probs, _m, score, _src = _native.speculate_tree(t._t, None, k, 4.0, 4.0, 0.0, w)
    assert len(toks) <= k
    for i, p in enumerate(parents):
        assert -1 <= p < i
        if p >= 0:
            assert probs[i] <= probs[p]  # a continuation is never more probable than its stem
    assert probs == tuple(sorted(probs, reverse=True))  # taken best first
    assert score == pytest.approx(sum(probs))


def test_suffix_session_proposes_trees_whose_first_branch_is_its_draft():
    from edgespec.api.params import SamplingParams
    from edgespec.proposers.suffix import SuffixProposer

    p = SuffixProposer(use_global=False, max_draft=8)
    s = p.open([1, 2, 3, 4, 9, 8, 1, 2, 3, 5, 9, 7, 1, 2], SamplingParams())
    tree = s.propose_tree(8, max_children=2)
    draft = s.propose(8)
    assert tree.path_tokens(tree.path(tree.leaves[0]))[:len(draft)] == draft.tokens
    assert tree.width == 2 and tree.source == "request"
    assert s.propose_tree(0).width == 0
    s.close(completed=False)
    assert s.propose_tree(4).width == 0


# --- n-gram statistics: the alternatives at a position ---------------------------------------

@settings(max_examples=150, deadline=None)
@given(tokens=repetitive_stream(120, vocab=5), n=st.integers(1, 3), k=st.integers(0, 8),
       at=st.integers(0, 200))
def test_ngstat_top_matches_brute_force_counts(tokens, n, k, at):
    from collections import Counter

    from edgespec.proposers._native_types import NgramStats

    s = NgramStats(1, 3, 1 << 22)
    s.begin([])
    s.extend(tokens)
    if len(tokens) < n:
        return
    i = at % (len(tokens) - n + 1)
    gram = tokens[i:i + n]
    follow = Counter(tokens[j + n] for j in range(len(tokens) - n)
                     if tokens[j:j + n] == gram)
    want = sorted(follow.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    toks, counts, total = s.top(gram, k)
    assert list(zip(toks, counts)) == want
    assert total == sum(follow.values())


def test_ngstat_top_refuses_bad_k():
    from edgespec.proposers._native_types import NgramStats

    s = NgramStats(1, 2, 1 << 20)
    with pytest.raises(InvalidInputError, match=r"k=\d+ is out of range: it must be in \[0, "):
        s.top([1], _native.MAX_TREE_CHILDREN + 1)
    assert s.top([1], 3) == ((), (), 0)


def test_ngram_session_tree_keeps_its_linear_draft_first():
    from edgespec.api.params import SamplingParams
    from edgespec.proposers.ngram import NgramProposer

    p = NgramProposer(use_dynamic=False)
    s = p.open([1, 2, 3, 4, 9, 8, 1, 2, 3, 5, 9, 7, 1, 2, 3, 4, 9, 6, 1, 2, 3], SamplingParams())
    draft = s.propose(8)
    tree = s.propose_tree(8, 3)
    assert draft.tokens == (4, 9)
    assert tree.path_tokens(tree.path(tree.leaves[0])) == draft.tokens
    assert tree.tokens == (4, 9, 5, 9) and tree.parents == (-1, 0, -1, 2)
    assert tree.confidence == pytest.approx((2 / 3, 2 / 3, 1 / 3, 1 / 3))
    s.close(completed=False)
    assert s.propose_tree(8).width == 0
