import json

import pytest

from edgespec.api.stats import JsonlSink, MemorySink, RequestStats, _pct


def test_step_accounting_and_derived_values():
    s = RequestStats(proposer="ngram")
    s.observe_prefill(10, 0.5)
    s.observe_step(proposer=None, drafted=0, accepted=0, emitted=1, draft_seconds=0,
                   verify_seconds=0.5, elapsed=0.5)
    s.observe_step(proposer="ngram", drafted=3, accepted=2, emitted=3, draft_seconds=0.001,
                   verify_seconds=0.2, elapsed=0.7)
    s.observe_step(proposer="ngram", drafted=2, accepted=0, emitted=1, draft_seconds=0.001,
                   verify_seconds=0.15, elapsed=0.85)
    s.finish("length", 0.9)
    assert s.generated_tokens == 5
    assert s.drafted == 5 and s.accepted == 2
    assert s.acceptance_rate == 0.4
    assert s.accepted_length_hist == {1: 2, 3: 1}
    assert s.mean_accepted_length == (1 + 1 + 3) / 3
    assert s.position_acceptance == [0.5, 0.5, 0.0]
    assert s.ttft_seconds == 0.5
    assert abs(s.proposer_share["ngram"] - 0.4) < 1e-12
    assert abs(s.decode_tokens_per_second - 4 / 0.4) < 1e-9
    d = s.to_dict()
    assert d["accepted_length_hist"] == {"1": 2, "3": 1}
    assert "acceptance 2/5 = 40.0%" in s.summary()


def test_percentile_interpolates():
    assert _pct([], 50) == 0.0
    assert _pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert _pct([1.0, 2.0, 3.0, 4.0], 100) == 4.0


def test_sinks(tmp_path):
    s = RequestStats()
    s.finish("eos", 1.0)
    mem = MemorySink()
    mem.emit(s)
    assert mem.records == [s]
    path = tmp_path / "r.jsonl"
    JsonlSink(str(path)).emit(s)
    JsonlSink(str(path)).emit(s)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["stop_reason"] == "eos"


def _short_all_accepted(prefill=0.5, ttft=0.855, pass_seconds=0.1) -> RequestStats:
    """12 tokens: the prefill's token, then three passes whose drafts were all accepted
    (3 + bonus, 3 + bonus, 2 + bonus); the first token came late (a draft model's setup)."""
    s = RequestStats(proposer="draft")
    s.observe_prefill(200, prefill)
    s.observe_step(proposer=None, drafted=0, accepted=0, emitted=1, draft_seconds=0.0,
                   verify_seconds=0.0, elapsed=ttft)
    t = ttft
    for drafted in (3, 3, 2):
        t += pass_seconds
        s.observe_step(proposer="draft", drafted=drafted, accepted=drafted, emitted=drafted + 1,
                       draft_seconds=0.01, verify_seconds=pass_seconds - 0.01, elapsed=t)
    s.finish("length", t)
    return s


def test_decode_rate_counts_only_what_follows_the_first_token():
    s = _short_all_accepted()
    assert s.generated_tokens == 12 and s.acceptance_rate == 1.0
    assert s.ttft_seconds == pytest.approx(0.855)
    assert s.decode_tokens == 11
    assert s.decode_seconds == pytest.approx(0.3)
    # 11 tokens in 3 passes of 0.1 s; before the fix the 0.355 s between the end of the
    # prefill and the first token were decode time too (11 / 0.655 = 16.8 tok/s)
    assert s.decode_tokens_per_second == pytest.approx(11 / 0.3)
    d = s.to_dict()
    assert d["decode_seconds"] == pytest.approx(0.3) and d["ttft_seconds"] == pytest.approx(0.855)
    assert "TTFT 855 ms" in s.summary()


def test_decode_rate_does_not_depend_on_what_the_prompt_cost():
    fast, slow = _short_all_accepted(0.1, 0.11), _short_all_accepted(5.0, 7.5)
    assert fast.decode_tokens_per_second == pytest.approx(slow.decode_tokens_per_second)


def test_no_decode_rate_before_a_second_token():
    s = RequestStats()
    assert s.decode_seconds == 0.0 and s.decode_tokens_per_second == 0.0
    s.observe_prefill(4, 0.2)
    s.observe_step(proposer=None, drafted=0, accepted=0, emitted=1, draft_seconds=0.0,
                   verify_seconds=0.0, elapsed=0.21)
    s.finish("length", 0.21)
    assert s.decode_tokens == 0 and s.decode_tokens_per_second == 0.0
