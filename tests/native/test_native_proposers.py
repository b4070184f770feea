"""The ngram and suffix proposers through the proposer protocol, and the suffix cache file."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_reference import ngram_propose
from native_reference import speculate as ref_speculate
from native_strategies import stream

from edgespec.errors import EdgespecError, InvalidInputError
from edgespec.runtime.native import CacheFileError, load_sequences, save_sequences
from edgespec.proposers._native_types import SuffixTree
from edgespec.api.params import SamplingParams
from edgespec.proposers import free_proposer
from edgespec.proposers.base import EMPTY_DRAFT, Proposer, ProposerSession
from edgespec.proposers.ngram import NgramProposer
from edgespec.proposers.suffix import SuffixProposer

GREEDY = SamplingParams()


@pytest.mark.parametrize("name", ["ngram", "suffix"])
def test_protocol(name):
    p = free_proposer(name)
    assert isinstance(p, Proposer) and p.name == name and p.costly is False
    s = p.open([1, 2, 3, 1, 2], GREEDY)
    assert isinstance(s, ProposerSession)
    d = s.propose(4)
    assert d.tokens and d.tokens[0] == 3 and d.match_length == 2
    assert s.propose(0) is EMPTY_DRAFT
    s.accept([3], 1)
    s.close(completed=True)
    s.close(completed=True)  # idempotent
    p.close()


def replay(session, prompt, output, k, steps):
    """Drives a session like the engine: propose, then accept a prefix plus one token."""
    seen = list(prompt)
    drafts = []
    i = 0
    for accept_n in steps:
        if i >= len(output):
            break
        d = session.propose(k)
        drafts.append((list(seen), d))
        n = min(accept_n, len(output) - i - 1)
        new = output[i:i + n + 1]
        session.accept(new, min(n, len(d.tokens)))
        seen += new
        i += len(new)
    return drafts


@settings(max_examples=60, deadline=None)
@given(prompt=stream(80), output=stream(60), k=st.integers(1, 12),
       steps=st.lists(st.integers(0, 4), min_size=1, max_size=40))
def test_ngram_session_follows_the_reference(prompt, output, k, steps):
    p = NgramProposer(min_n=1, max_n=3, max_draft=8, statistics=False)  # plain prompt lookup
    s = p.open(prompt, GREEDY)
    for seen, d in replay(s, prompt, output, k, steps):
        want, n = ngram_propose(seen, 1, 3, min(k, 8))
        assert list(d.tokens) == want and d.match_length == n
        assert d.confidence is None and d.probs is None


@settings(max_examples=60, deadline=None)
@given(earlier=st.lists(stream(40), max_size=3), prompt=stream(60), output=stream(50),
       k=st.integers(1, 12), steps=st.lists(st.integers(0, 4), min_size=1, max_size=30))
def test_suffix_session_follows_the_reference(earlier, prompt, output, k, steps):
    p = SuffixProposer(factor=1.5, offset=1.0, min_token_prob=0.2, max_draft=8, max_depth=6)
    for e in earlier:
        p.remember(e)
    s = p.open(prompt, GREEDY)
    for seen, d in replay(s, prompt, output, k, steps):
        toks, probs, m, score, src = ref_speculate(seen, earlier, seen, 6, min(k, 8), 1.5, 1.0,
                                                   0.2)
        assert d.tokens == toks and d.match_length == m
        if toks:
            assert d.confidence == probs and d.score == score
            assert d.source == ("request", "global")[src - 1]


def test_suffix_learns_across_requests():
    p = SuffixProposer(max_draft=16, offset=4.0)
    response = list(range(100, 140))
    s = p.open([1, 2, 3], GREEDY)
    for t in response:
        s.accept([t], 0)
    s.close(completed=True)
    # a new request whose output starts the same way is drafted from the global tree
    s = p.open([9, 9, 9], GREEDY)
    s.accept(response[:3], 0)
    d = s.propose(8)
    # matched 3 tokens: factor 1 * 3 + offset 4 = 7 tokens
    assert d.source == "global" and d.tokens == tuple(response[3:10]) and d.match_length == 3
    assert all(c == 1.0 for c in d.confidence)
    s.close(completed=False)  # cancelled: not remembered
    assert p.global_tree.num_sequences == 1


def test_suffix_without_global_tree():
    p = SuffixProposer(use_global=False)
    s = p.open([1, 2, 3, 1, 2], GREEDY)
    assert s.propose(4).source == "request"
    s.close(True)
    assert p.global_tree is None


def test_suffix_cache_tokens_cap():
    p = SuffixProposer(cache_tokens=100)
    for i in range(10):
        p.remember(list(range(i * 1000, i * 1000 + 30)))
    g = p.global_tree
    assert g.num_tokens <= 100 and g.sequences()[-1][0] == 9000


def test_suffix_cache_persists_across_runs(tmp_path):
    path = tmp_path / "sub" / "suffix.cache"
    p = SuffixProposer(cache_path=path)
    for r in ([5, 6, 7, 8, 9], [5, 6, 7, 1]):
        s = p.open([0], GREEDY)
        s.accept(r, 0)
        s.close(completed=True)
    p.close()
    assert path.exists()
    q = SuffixProposer(cache_path=path)
    assert [x.tolist() for x in q.global_tree.sequences()] == [[5, 6, 7, 8, 9], [5, 6, 7, 1]]
    s = q.open([5, 6], GREEDY)
    d = s.propose(4)  # 7 always followed "5 6"; then 8 and 1 tie, the lower id wins
    assert d.source == "global" and d.tokens == (7, 1) and d.confidence == (1.0, 0.5)
    q.close()


def test_corrupt_cache_is_a_clean_error(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(b"not a cache at all, just some bytes....................")
    with pytest.raises(CacheFileError) as ei:
        SuffixProposer(cache_path=path)
    assert isinstance(ei.value, EdgespecError) and "delete it" in str(ei.value)


@pytest.mark.parametrize("kw", [
    dict(factor=-1), dict(offset=float("nan")), dict(min_token_prob=2), dict(max_draft=0),
    dict(max_draft=10_000), dict(max_depth=1), dict(cache_bytes=10), dict(request_bytes=5),
    dict(cache_tokens=-1),
])
def test_suffix_bad_knobs(kw):
    with pytest.raises(InvalidInputError):
        SuffixProposer(**kw)


@pytest.mark.parametrize("kw", [dict(min_n=0), dict(min_n=4, max_n=3), dict(max_draft=0),
                                dict(max_bytes=1)])
def test_ngram_bad_knobs(kw):
    with pytest.raises(InvalidInputError):
        NgramProposer(**kw)


@pytest.mark.parametrize("cls", [NgramProposer, SuffixProposer])
def test_bad_tokens_are_input_errors(cls):
    p = cls()
    with pytest.raises(InvalidInputError):
        p.open([1, -2, 3], GREEDY)
    s = p.open([1, 2, 3], GREEDY)
    with pytest.raises(InvalidInputError):
        s.accept([2**40], 0)
    with pytest.raises(InvalidInputError):
        s.accept(["x"], 0)


def test_capacity_turns_a_session_quiet_not_broken():
    p = NgramProposer(max_bytes=64 << 10)
    s = p.open(list(range(20_000)), GREEDY)  # far over the cap
    assert s.propose(4) is EMPTY_DRAFT
    s.accept([1, 2], 0)
    s.close(True)
    q = SuffixProposer(request_bytes=64 << 10, use_global=False)
    s = q.open(list(range(20_000)), GREEDY)
    assert s.propose(4) is EMPTY_DRAFT
    s.accept([1], 0)


# --- cache file ------------------------------------------------------------------------

def test_cache_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 2**31 - 1, size=n).astype(np.int32) for n in (0, 1, 17, 300)]
    save_sequences(tmp_path / "c", seqs, 64)
    back = load_sequences(tmp_path / "c")
    assert len(back) == len(seqs) and all(np.array_equal(a, b) for a, b in zip(seqs, back))
    t = SuffixTree(8, 1 << 24)
    for s in seqs:
        t.add(s)
    t.save(tmp_path / "t")
    u = SuffixTree(8, 1 << 24)
    assert u.load(tmp_path / "t") == 4
    assert all(np.array_equal(a, b) for a, b in zip(t.sequences(), u.sequences()))
    u.check(deep=True)


def _valid_cache(tmp_path) -> bytes:
    save_sequences(tmp_path / "v", [np.arange(10, dtype=np.int32), np.arange(3, dtype=np.int32)], 8)
    return (tmp_path / "v").read_bytes()


@pytest.mark.parametrize("mutate", [
    lambda b: b[:10],                                      # truncated header
    lambda b: b[:-7] + b[-4:],                             # truncated body
    lambda b: b"X" + b[1:],                                # bad magic
    lambda b: b[:16] + struct.pack("<I", 99) + b[20:],     # unknown version
    lambda b: b[:24] + struct.pack("<Q", 2**60) + b[32:],  # absurd sequence count
    lambda b: b[:-20] + bytes([b[-20] ^ 1]) + b[-19:],     # flipped token bit
    lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]),              # bad checksum
    lambda b: b + b"\0\0\0\0",                             # trailing bytes
    lambda b: b"",                                         # empty file
])
def test_corrupt_cache_files(tmp_path, mutate):
    path = tmp_path / "c"
    path.write_bytes(mutate(_valid_cache(tmp_path)))
    with pytest.raises(CacheFileError):
        load_sequences(path)


def test_corrupt_cache_with_valid_checksum(tmp_path):
    import zlib
    good = _valid_cache(tmp_path)
    body = bytearray(good[:-4])
    body[40:44] = struct.pack("<I", 11)  # lengths no longer add up
    (tmp_path / "a").write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))))
    with pytest.raises(CacheFileError, match="add up"):
        load_sequences(tmp_path / "a")
    body = bytearray(good[:-4])
    body[-4:] = struct.pack("<i", -5)  # negative token id
    (tmp_path / "b").write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))))
    with pytest.raises(CacheFileError, match="negative"):
        load_sequences(tmp_path / "b")


def test_missing_or_unreadable_cache(tmp_path):
    with pytest.raises(CacheFileError):
        load_sequences(tmp_path / "nope")
    with pytest.raises(CacheFileError):
        load_sequences(tmp_path)  # a directory
