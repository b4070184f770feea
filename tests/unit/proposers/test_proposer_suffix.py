"""The suffix proposer scores matches as Arctic Inference does, on the same scale as the
n-gram proposer (both: the expected number of accepted tokens)."""
from __future__ import annotations

import pytest

from edgespec.api.params import SamplingParams
from edgespec.proposers.ngram import NgramProposer
from edgespec.proposers.suffix import SuffixProposer

GREEDY = SamplingParams()


def test_confidence_is_the_path_probability_and_score_its_sum():
    p = SuffixProposer(factor=1.0, offset=4.0, min_token_prob=0.0, use_global=False)
    # "1 2" was followed by 3, 3, 4: p(3) = 2/3; then "1 2 3" -> 5 or 6 (1/2 each)
    s = p.open([1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 4, 1, 2], GREEDY)
    d = s.propose(8)
    assert d.tokens[:2] == (3, 5)
    assert d.confidence[:2] == pytest.approx((2 / 3, 1 / 3))
    assert all(a >= b for a, b in zip(d.confidence, d.confidence[1:]))  # a product never rises
    assert d.score == pytest.approx(sum(d.confidence))


def test_length_budget_grows_with_the_match():
    stream = list(range(10, 30))
    p = SuffixProposer(factor=0.5, offset=1.0, min_token_prob=0.0, max_draft=6, use_global=False)
    for m in (1, 2, 4, 8, 16):
        seen = stream + stream[:m]  # the tail matches m tokens
        d = p.open(seen, GREEDY).propose(16)
        assert d.match_length == m and len(d) == min(6, int(0.5 * m + 1.0))
        assert d.tokens == tuple(seen[m:m + len(d)])


def test_min_token_prob_stops_the_path():
    prompt = [1, 2, 3, 7, 1, 2, 4, 8, 1, 2, 5, 9, 1, 2]  # "1 2" -> 3, 4, 5: 1/3 each
    sure = SuffixProposer(offset=4.0, min_token_prob=0.5, use_global=False)
    assert len(sure.open(prompt, GREEDY).propose(8)) == 0
    lax = SuffixProposer(offset=4.0, min_token_prob=0.3, use_global=False)
    d = lax.open(prompt, GREEDY).propose(8)
    assert d.tokens[0] == 3 and d.confidence[0] == pytest.approx(1 / 3)


def test_scores_are_comparable_with_the_ngram_proposer():
    """On the same context both proposers draft the same tokens with the same expected
    accepted length, so the engine can verify whichever scores higher."""
    prompt = [1, 2, 3, 1, 2, 4, 1, 2]
    suffix = SuffixProposer(factor=1.0, offset=2.0, min_token_prob=0.0, use_global=False)
    ngram = NgramProposer(min_n=1, max_n=3, min_share=0.5, share_step=0.0, use_dynamic=False)
    a = suffix.open(prompt, GREEDY).propose(4)
    b = ngram.open(prompt, GREEDY).propose(4)
    assert a.tokens == b.tokens == (3, 1, 2, 4)
    # suffix: path probabilities 0.5 throughout; n-gram: shares 0.5, 1, 1, 1 -> products 0.5
    assert a.score == pytest.approx(b.score) == pytest.approx(2.0)
    # past the end of the context the tree has not seen how the last "7" goes on (1/2),
    # while the n-gram statistics read on through the draft: the scores say which knows more
    c = ngram.open([5, 6, 7, 5, 6, 7, 5, 6], GREEDY).propose(4)
    e = suffix.open([5, 6, 7, 5, 6, 7, 5, 6], GREEDY).propose(4)
    assert c.tokens == e.tokens == (7, 5, 6, 7)
    assert c.score == pytest.approx(4.0) and e.score == pytest.approx(3.5)


def test_without_recall_a_session_ignores_the_global_tree_but_still_teaches_it():
    # proposers.base.Remembers: the loop turns recall off for a reproducible request
    p = SuffixProposer(factor=1.0, offset=4.0, min_token_prob=0.0)
    p.remember([40, 41, 42, 43, 44])
    p.recall = False
    s = p.open([7, 8, 40, 41], GREEDY)
    assert len(s.propose(4)) == 0  # only the global tree knows what follows 40 41
    s.accept([60, 61, 62, 63], 0)
    s.close(completed=True)
    p.recall = True
    s = p.open([5, 40, 41], GREEDY)
    assert s.propose(3).tokens == (42, 43, 44)
    s.close(completed=False)
    s = p.open([5, 60, 61], GREEDY)
    assert s.propose(2).tokens == (62, 63)  # the recall-off request's response was kept
    s.close(completed=False)
    p.close()
