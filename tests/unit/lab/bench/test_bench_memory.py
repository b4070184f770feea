"""The bench's memory bound, by construction: the run keeps a record of bounded size per
request whatever the answers' length (per-token fields go to the sink only); busy units are
warned about once and counted; ITL percentiles from the kept histograms."""
from __future__ import annotations

import json
import math

from edgespec.lab.bench import runner as runner_mod
from edgespec.lab.bench.records import PER_TOKEN_FIELDS, compact
from edgespec.lab.bench.report import busy_warning, draft_length, render_markdown
from edgespec.lab.bench.results import config_summary
from edgespec.lab.bench.runner import BenchRun, Runner
from edgespec.lab.bench.matrix import Matrix
from edgespec.lab.bench.stats import histogram_percentile, latency_histogram, percentile
from test_bench_runner import CONFIGS, PROMPTS, FakeEngine, _matrix


def _kept(max_tokens: int):
    eng = FakeEngine(tokens_for=lambda p, n: list(range(1, n + 1)))
    m = Matrix(target="t", configs=CONFIGS, spec_bench=("writing",), max_new_tokens=max_tokens,
               warmup=0)
    full: list[dict] = []
    run = Runner(m, eng, sink=full.extend).run(PROMPTS, BenchRun(m))
    return run, full


def _longest_list(x) -> int:
    if isinstance(x, dict):
        return max((_longest_list(v) for v in x.values()), default=0)
    if isinstance(x, list):
        return max([len(x), *(_longest_list(v) for v in x)])
    return 0


def test_the_run_keeps_no_per_token_lists_whatever_the_answer_length():
    short, _ = _kept(8)
    long, full = _kept(2000)
    assert max(len(r["token_times"]) for r in full) == 2000  # the sink got every token time
    for run in (short, long):
        for r in run.records:
            assert not set(PER_TOKEN_FIELDS) & r.keys()
            assert _longest_list(r) <= 64  # position lists are bounded by the draft length
    size = lambda run: max(len(json.dumps(r)) for r in run.records)  # noqa: E731
    assert size(long) < size(short) + 64  # 250x the tokens, the same record size


def test_itl_percentiles_from_histograms_are_within_a_bin():
    times = [0.0]
    for i in range(1, 400):  # gaps from 1 ms to 400 ms, and zeros (one verify pass)
        times.append(times[-1] + (0.0 if i % 4 == 0 else i / 1000))
    gaps = [b - a for a, b in zip(times, times[1:])]
    hist = latency_histogram(times)
    for q in (50, 95, 99):
        exact, approx = percentile(gaps, q), histogram_percentile([hist], q)
        assert math.isclose(approx, exact, rel_tol=0.12), (q, approx, exact)
    assert histogram_percentile([hist], 1) == 0.0  # the zeros stay zeros
    assert math.isnan(histogram_percentile([], 50))
    rec = compact({"token_times": times, "tokens": [1] * 400, "text": "abc", "x": 1})
    assert rec == {"itl_hist": hist, "text_chars": 3, "x": 1}


def test_a_busy_unit_is_warned_once_and_counted(monkeypatch):
    monkeypatch.setattr(runner_mod.CpuWatch, "share", lambda self: 0.8)
    said: list[str] = []
    m = _matrix(warmup=0)
    run = Runner(m, FakeEngine(), warn=said.append).run(PROMPTS, BenchRun(m))
    assert len(said) == 1 and "80%" in said[0]
    assert run.busy["busy_units"] == run.busy["units"] == 3 and run.busy["max_unit"] == 0.8
    data = run.to_dict()
    data["busy"]["at_start"] = 0.5
    text = busy_warning(data)
    assert "50% of the CPUs at the start" in text and "3 of 3 units" in text
    assert "**Warning**: other processes" in render_markdown(data)
    quiet = {**data, "busy": {"limit": 0.25, "at_start": 0.01, "busy_units": 0, "units": 3,
                              "max_unit": 0.1}}
    assert busy_warning(quiet) == "" and "**Warning**" not in render_markdown(quiet)


def test_draft_length_is_said():
    def run(control, knobs=None):
        return {"identity": {"engine": {"control": control, "control_knobs": knobs or {}}}}
    assert draft_length(run({"adaptive": True, "max_draft": 15})) == "up to 15 (adaptive)"
    assert draft_length(run({"adaptive": False, "max_draft": 4},
                            {"ngram:n=3": {"max_draft": 6}})) == "4; ngram:n=3: 6"
    # a run recorded before the vocabulary settled: fixed control's draft_length, draft_len knobs
    assert draft_length(run({"adaptive": False, "max_draft": 15, "draft_length": 4},
                            {"ngram:n=3": {"draft_len": 6}})) == "4; ngram:n=3: 6"
    assert draft_length({}) == "?"


def test_kept_records_give_the_same_summary_as_whole_ones():
    run, full = _kept(40)
    whole = {**run.to_dict(), "records": full}
    for c in ("none", "a"):
        a, b = config_summary(run.to_dict(), c), config_summary(whole, c)
        assert (a.requests, a.acceptance_rate == a.acceptance_rate) == \
            (b.requests, b.acceptance_rate == b.acceptance_rate)
        assert math.isclose(a.itl_p50, b.itl_p50, rel_tol=0.12)


def test_bench_json_takes_the_whole_records_from_the_sink_file(tmp_path):
    from edgespec.lab.bench.records import RecordSink
    from edgespec.lab.bench.results import load_run, write_json

    eng = FakeEngine(tokens_for=lambda p, n: list(range(1, n + 1)))
    m = Matrix(target="t", configs=CONFIGS, spec_bench=("writing",), max_new_tokens=5, warmup=0)
    sink = RecordSink(tmp_path / "out" / "records.jsonl")
    run = Runner(m, eng, sink=sink.write).run(PROMPTS, BenchRun(m))
    sink.close()
    data = run.to_dict()
    path = write_json(data, tmp_path / "out" / "bench.json", records_from=sink.path)
    back = load_run(path)
    assert len(back["records"]) == len(data["records"]) == 9
    assert all(len(r["tokens"]) == 5 and len(r["token_times"]) == 5 for r in back["records"])
    assert {k: v for k, v in back.items() if k != "records"} == \
        json.loads(json.dumps({k: v for k, v in data.items() if k != "records"}))
    # and a summary of the whole records agrees with that of the kept ones
    assert config_summary(back, "a").requests == config_summary(data, "a").requests
    assert not RecordSink(tmp_path / "never" / "r.jsonl").path.parent.exists()  # lazily made
