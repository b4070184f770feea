import json

from edgespec.stats import JsonlSink, MemorySink, RequestStats, _pct


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
