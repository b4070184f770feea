"""The realign proposer: following the text an edit copies, and re-entering it after a change."""
from __future__ import annotations

import pytest

from edgespec.api.params import SamplingParams
from edgespec.errors import InvalidInputError
from edgespec.proposers import REGISTRY, free_proposer
from edgespec.proposers.realign import RealignProposer

SOURCE = list(range(100, 140))  # 40 distinct tokens: the text being edited
SEP = [7, 8, 9]  # the instruction between the source and the answer


def session(**kw):
    return RealignProposer(**kw).open(SOURCE + SEP, SamplingParams())


def test_follows_the_copy_once_the_tail_matches():
    s = session()
    s.accept([100, 101], 0)
    assert s.propose(5).tokens == ()  # two tokens are not min_match
    s.accept([102], 0)
    d = s.propose(5)
    assert d.tokens == (103, 104, 105, 106, 107) and d.match_length == 3
    s.accept([103, 104, 105, 106], 4)
    d = s.propose(4)
    assert d.tokens == (107, 108, 109, 110) and d.match_length == 7  # the run so far


def test_a_one_token_replacement_is_drafted_as_a_substitution():
    s = session()
    s.accept([100, 101, 102, 103, 104], 0)
    s.accept([999], 0)  # the edit: 999 where the source says 105
    d = s.propose(4)
    assert d.tokens == (106, 107, 108, 109) and d.match_length == 1
    s.accept([106, 107], 1)  # it was one: back in sync
    assert s.propose(3).tokens == (108, 109, 110)


def test_an_insertion_reenters_at_the_token_it_broke_off_from():
    s = session()
    s.accept([100, 101, 102, 103, 104], 0)
    s.accept([901, 902, 903], 0)  # inserted before 105
    s.accept([105], 0)  # writes the anchor's token: the insertion ended
    d = s.propose(3)
    assert d.tokens == (106, 107, 108) and d.match_length == 2


def test_a_deletion_reenters_where_the_last_two_tokens_match():
    s = session()
    s.accept([100, 101, 102, 103, 104], 0)
    s.accept([110, 111], 0)  # 105..109 left out
    assert s.propose(3).tokens == (112, 113, 114)


def test_a_longer_replacement_stops_drafting_substitutions():
    s = session(substitution=2)
    s.accept([100, 101, 102, 103, 104], 0)
    s.accept([901, 902], 0)
    assert s.propose(2).tokens == (107, 108)  # as if two tokens were replaced
    s.accept([903], 0)
    assert s.propose(2).tokens == ()  # past the substitution horizon, nothing to follow


def test_novel_text_drafts_nothing():
    s = session()
    s.accept([500, 501, 502, 503, 504], 0)
    assert len(s.propose(8)) == 0


def test_a_draft_never_runs_past_the_history():
    s = RealignProposer().open([1, 2, 3, 4], SamplingParams())
    s.accept([1, 2, 3], 0)
    assert s.propose(10).tokens == (4, 1, 2, 3)  # the history is all it can copy
    assert len(s.propose(0)) == 0


def test_the_registry_builds_it_opt_in_with_checked_options():
    spec = REGISTRY["realign"]
    assert spec.opt_in and not spec.costly
    p = free_proposer("realign", min_match=4, window=32)
    assert isinstance(p, RealignProposer) and p.min_match == 4 and p.window == 32
    with pytest.raises(InvalidInputError, match="min_match"):
        free_proposer("realign", min_match=0)
    with pytest.raises(InvalidInputError):
        free_proposer("realign", window="wide")
