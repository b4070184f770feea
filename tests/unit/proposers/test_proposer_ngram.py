"""The ngram proposer: confident drafts from n-gram statistics, and the dynamic statistics
that persist across requests and runs."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from edgespec.errors import InvalidInputError
from edgespec.runtime.native import load_records, save_records
from edgespec.api.params import SamplingParams
from edgespec.proposers.base import EMPTY_DRAFT
from edgespec.proposers.ngram import NgramProposer
from edgespec.proposers.ngram_stats import StatsFileWarning, stats_file

GREEDY = SamplingParams()


def generate(p: NgramProposer, prompt, output, completed=True):
    s = p.open(prompt, GREEDY)
    s.accept(output, 0)
    s.close(completed=completed)


def test_drafts_only_what_the_evidence_supports():
    p = NgramProposer(min_n=1, max_n=3, use_dynamic=False, min_share=0.5, share_step=0.2)
    # "a b" -> c twice, d once; then "b c" -> a twice (2/2), "c a" -> b (2/2), "a b" again
    s = p.open([1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2], GREEDY)
    d = s.propose(8)
    # position 0: 2/3 >= 0.5; positions 1, 2: 1.0 >= 0.7, 0.9; position 3: "1 2" at 2/3 < 1.0
    assert d.tokens == (3, 1, 2) and d.confidence == (2 / 3, 1.0, 1.0)
    assert d.source == "context" and d.match_length == 2
    # the score is the expected accepted length: the sum of the running products
    assert d.score == pytest.approx(2 / 3 * 3)
    assert s.propose(1).tokens == (3,) and s.propose(0) is EMPTY_DRAFT


def test_more_samples_further_out():
    p = NgramProposer(min_n=2, max_n=2, use_dynamic=False, min_count=1, count_step=1, share_step=0)
    s = p.open([7, 8, 9, 7, 8, 9, 7, 8], GREEDY)
    # "7 8" -> 9 (2 samples, position 0 needs 1); "8 9" -> 7 (2, needs 2); "9 7" -> 8 (2, needs 3)
    assert s.propose(8).tokens == (9, 7)


def test_nothing_confident_means_no_draft():
    p = NgramProposer(use_dynamic=False)
    s = p.open(list(range(100)), GREEDY)  # nothing repeats
    assert s.propose(8) is EMPTY_DRAFT
    s.accept([5, 6], 0)  # "5 6" occurred, followed by 7
    assert s.propose(8).tokens[:2] == (7, 8)


def test_dynamic_statistics_learn_across_requests():
    p = NgramProposer(dynamic_count=2, dynamic_share=0.66)
    answer = [50, 51, 52, 53, 54]
    generate(p, [1, 2, 3], answer)
    s = p.open([9, 8, 7], GREEDY)
    s.accept([50, 51], 0)
    assert s.propose(4) is EMPTY_DRAFT  # seen once: the dynamic bar needs 2 samples
    s.close(completed=True)
    generate(p, [4, 5], answer)
    s = p.open([6, 6, 6], GREEDY)
    s.accept([50, 51], 0)
    d = s.propose(4)
    assert d.source == "dynamic" and d.tokens == (52, 53, 54)
    # a cancelled request teaches nothing
    before = p.dynamic.table.records().copy()
    generate(p, [1], [60, 61, 62, 63], completed=False)
    assert np.array_equal(p.dynamic.table.records(), before)
    p.close()


def test_without_recall_a_session_drafts_from_its_own_text_but_still_teaches():
    # proposers.base.Remembers: the loop turns recall off for a reproducible request
    p = NgramProposer(dynamic_count=1, dynamic_share=0.5)
    answer = [50, 51, 52, 53, 54]
    generate(p, [1, 2, 3], answer)
    p.recall = False
    s = p.open([6, 6, 6], GREEDY)
    s.accept([50, 51], 0)
    assert s.propose(4) is EMPTY_DRAFT  # the dynamic statistics know 52 53 54
    s.accept([70, 71, 72], 0)
    s.close(completed=True)
    p.recall = True
    s = p.open([9, 9], GREEDY)
    s.accept([70, 71], 0)
    assert s.propose(4).tokens[:1] == (72,)  # the recall-off request taught this
    s.close(completed=False)
    p.close()


def test_context_wins_over_dynamic():
    p = NgramProposer(min_n=2, max_n=2, dynamic_count=1, dynamic_share=0.0)
    for _ in range(3):
        generate(p, [0], [1, 2, 3])
    s = p.open([1, 2, 4, 1, 2], GREEDY)  # this request says "1 2" -> 4
    d = s.propose(1)
    assert d.tokens == (4,) and d.source == "context"


def test_persists_across_runs(tmp_path):
    path = tmp_path / "stats" / "model.ngrams"
    p = NgramProposer(stats_path=path, dynamic_count=1)
    generate(p, [1, 2], [10, 11, 12, 13])
    p.close()
    assert path.exists() and not list(path.parent.glob("*.tmp"))  # written atomically
    q = NgramProposer(stats_path=path, dynamic_count=1)
    s = q.open([7, 10, 11], GREEDY)
    assert s.propose(4).tokens == (12, 13) and s.propose(4).source == "dynamic"
    q.close()


def test_keyed_by_model_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    p = NgramProposer(model_digest="ab12" * 16)
    generate(p, [1], [2, 3, 4])
    p.close()
    assert stats_file("ab12" * 16) == tmp_path / "ngram" / f"{'ab12' * 16}.ngrams"
    assert stats_file("ab12" * 16).exists()
    # without a key nothing is written: counts mean nothing under another vocabulary
    r = NgramProposer()
    generate(r, [1], [2, 3, 4])
    r.close()
    assert [f.name for f in (tmp_path / "ngram").iterdir()] == [f"{'ab12' * 16}.ngrams"]
    with pytest.raises(InvalidInputError):
        stats_file("../escape")


def test_bounded(tmp_path):
    p = NgramProposer(dynamic_bytes=64 << 10, stats_path=tmp_path / "s")
    rng = np.random.default_rng(0)
    for _ in range(30):
        generate(p, [1], rng.integers(0, 30_000, size=500).tolist())
    assert p.memory_usage() <= 64 << 10 and p.dynamic.table.decays > 0
    p.close()
    assert (tmp_path / "s").stat().st_size <= 64 << 10


def _valid_file(tmp_path):
    p = NgramProposer(stats_path=tmp_path / "v", dynamic_count=1)
    generate(p, [1, 2], [3, 4, 5, 3, 4, 6])
    p.close()
    return (tmp_path / "v").read_bytes()


@pytest.mark.parametrize("mutate, why", [
    (lambda b: b[:20], "truncated"),
    (lambda b: b[:-9] + b[-4:], "wrong size"),
    (lambda b: b"Y" + b[1:], "not an edgespec"),
    (lambda b: b[:16] + struct.pack("<I", 2) + b[20:], "format version 2"),
    (lambda b: b[:-12] + bytes([b[-12] ^ 4]) + b[-11:], "checksum"),
    (lambda b: b"", "truncated"),
])
def test_unusable_file_is_ignored_with_a_warning(tmp_path, mutate, why):
    path = tmp_path / "c.ngrams"
    bad = mutate(_valid_file(tmp_path))
    path.write_bytes(bad)
    with pytest.warns(StatsFileWarning, match=why):
        p = NgramProposer(stats_path=path, dynamic_count=1)
    assert p.dynamic.table.num_pairs == 0  # starts empty, drafting works
    generate(p, [1], [8, 9, 8, 9])
    p.close()
    # the unusable file is kept aside, the new statistics replace it
    assert (tmp_path / "c.ngrams.bad").read_bytes() == bad
    assert len(load_records(path)) > 0


def test_checksummed_file_with_bad_records_is_ignored(tmp_path):
    rec = np.zeros((2, 11), np.int32)
    rec[:, :4] = [[1, 5, 1, 4], [1, -3, 1, 4]]  # a negative token
    save_records(tmp_path / "r", rec)
    with pytest.warns(StatsFileWarning, match="ids must be"):
        p = NgramProposer(stats_path=tmp_path / "r")
    assert p.dynamic.table.num_pairs == 0


def test_unreadable_path_warns_and_is_set_aside(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.warns(StatsFileWarning, match="cannot read"):
        p = NgramProposer(stats_path=tmp_path / "d")
    generate(p, [1], [2, 3])
    p.save(tmp_path / "elsewhere")  # an explicit path works
    assert len(load_records(tmp_path / "elsewhere")) > 0
    p.close()
    assert (tmp_path / "d.bad").is_dir() and len(load_records(tmp_path / "d")) > 0


def test_a_disk_that_refuses_warns_on_close(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    p = NgramProposer(stats_path=tmp_path / "file" / "stats")
    generate(p, [1], [2, 3])
    with pytest.warns(StatsFileWarning, match="could not save"):
        p.close()


def test_plain_prompt_lookup_mode():
    p = NgramProposer(min_n=1, max_n=3, statistics=False)
    s = p.open([1, 2, 3, 4, 1, 2], GREEDY)
    d = s.propose(6)
    assert d.tokens == (3, 4, 1, 2, 3, 4) and d.confidence is None and d.source == "ngram"
    with pytest.raises(InvalidInputError):
        p.save()


@pytest.mark.parametrize("kw", [
    dict(max_n=9), dict(min_share=1.5), dict(share_step=-0.1), dict(min_count=0),
    dict(count_step=-1), dict(dynamic_count=0), dict(dynamic_share=2), dict(dynamic_bytes=100),
    dict(model_digest="a/b"), dict(min_share=True),
])
def test_bad_knobs(kw):
    with pytest.raises(InvalidInputError):
        NgramProposer(**kw)
