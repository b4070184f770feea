"""Report arithmetic and rendering on literal per-request records (no model)."""
import json
import math

import pytest

from edgespec.lab.bench.report import render_markdown, write_report
from edgespec.lab.bench.results import (OVERALL, config_summary, load_run, slice_results, speedup_table,
                                    write_json)
from edgespec.errors import InvalidInputError


def rec(config, prompt, cat, tps, e2e, turn=0, drafted=0, accepted=0, hist=None, parity=None,
        bucket="<256", times=(0.1, 0.2, 0.3)):
    return {"config": config, "prompt_id": prompt, "category": cat, "turn": turn,
            "decode_tokens_per_second": tps, "e2e_seconds": e2e, "drafted": drafted,
            "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_length_hist": hist or {"1": 3}, "position_drafted": [drafted] if drafted else [],
            "position_accepted": [accepted] if drafted else [], "token_times": list(times),
            "parity": parity, "proposer_share": {"target": 1.0 - (accepted / 3 if drafted else 0)},
            "ttft_seconds": 0.1, "prefill_seconds": 0.1, "rss_peak_bytes": 2**20, "bucket": bucket}


def run_dict(records):
    return {"schema": 1, "identity": {"argv": ["edgespec", "bench"]}, "interrupted": False,
            "load_seconds": {"target": 1.5}, "warmup_discarded": 2,
            "matrix": {"configs": [{"label": "none"}, {"label": "ngram"}], "max_new_tokens": 3,
                       "temperature": 0.0, "buckets": [256], "bootstrap_resamples": 500,
                       "confidence": 0.95, "seed": 0, "preset": "quick"},
            "records": records}


RECORDS = [
    rec("none", "p1", "summarization", 10.0, 2.0),
    rec("ngram", "p1", "summarization", 20.0, 1.0, drafted=4, accepted=3, hist={"1": 1, "4": 1},
        parity=True),
    rec("none", "p2", "summarization", 10.0, 2.0),
    rec("ngram", "p2", "summarization", 40.0, 1.0, drafted=4, accepted=4, hist={"5": 1}, parity=True),
    rec("none", "p3", "writing", 10.0, 2.0, bucket=">=256"),
    rec("ngram", "p3", "writing", 9.0, 2.5, drafted=2, accepted=0, parity=False, bucket=">=256"),
    {"config": "ngram", "prompt_id": "p4", "category": "writing", "turn": 0, "error": "boom"},
]


def test_speedup_table_pairs_per_prompt():
    t = speedup_table(run_dict(RECORDS))
    summ = t["summarization"]["ngram"]
    assert summ.decode.estimate == pytest.approx(3.0)  # per category: the median of 2x and 4x
    assert summ.decode.n == 2 and summ.decode.low == pytest.approx(2.0) and summ.decode.high == pytest.approx(4.0)
    assert summ.e2e.estimate == pytest.approx(2.0)
    assert t["writing"]["ngram"].decode.estimate == pytest.approx(0.9)
    assert t["writing"]["ngram"].decode.low == t["writing"]["ngram"].decode.high  # one prompt
    # over all prompts: the geometric mean
    assert t[OVERALL]["ngram"].decode.estimate == pytest.approx((2.0 * 4.0 * 0.9) ** (1 / 3))
    b = speedup_table(run_dict(RECORDS), "bucket", ["<256", ">=256"])
    assert b[">=256"]["ngram"].decode.estimate == pytest.approx(0.9)


def test_config_summary_pools_requests():
    s = config_summary(run_dict(RECORDS), "ngram")
    assert s.requests == 3 and s.errors == 1
    assert s.acceptance_rate == pytest.approx(7 / 10)
    assert s.accepted_length_hist == {1: 4, 4: 1, 5: 1}
    assert s.mean_accepted_length == pytest.approx((4 + 4 + 5) / 6)
    assert s.position_acceptance == [pytest.approx(0.7)]
    assert sorted(s.request_acceptance) == [0.0, 0.75, 1.0]
    assert s.parity == (2, 3)
    assert s.itl_p50 == pytest.approx(0.1, rel=0.06)  # from a log histogram: within its bin


def test_slice_results_for_qualification():
    res = slice_results(run_dict(RECORDS), "ngram")
    assert set(res) == {"summarization", "writing"}
    assert res["summarization"]["speedup"] == pytest.approx(3.0, abs=1e-4)
    assert res["summarization"]["speedup_ci_low"] == pytest.approx(2.0)
    assert res["summarization"]["acceptance_rate"] == pytest.approx(7 / 8)
    assert res["writing"]["n"] == 1 and res["writing"]["parity"] == "0/1"


def test_markdown_and_files(tmp_path):
    data = run_dict(RECORDS)
    md = render_markdown(data)
    assert "| summarization | 3.00× [2.00, 4.00] (n=2) |" in md
    assert "| mean of the category medians | 1.95× |" in md
    assert "| writing | 0.90× (n=1) |" in md
    assert "## Errors" in md and "boom" in md
    p = write_json(data, tmp_path / "out" / "bench.json")
    assert load_run(p)["records"][0]["config"] == "none"
    report = write_report(load_run(p), tmp_path / "out")
    text = report.read_text()
    for png in ("speedup.png", "accepted_length.png", "request_acceptance.png", "latency.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000
        assert f"({png})" in text


def test_load_run_rejects_other_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"a": 1}))
    with pytest.raises(InvalidInputError, match="not a benchmark"):
        load_run(bad)
    with pytest.raises(InvalidInputError, match="not found"):
        load_run(tmp_path / "nope.json")


def test_interrupted_runs_say_so():
    data = run_dict(RECORDS[:2])
    data["interrupted"] = True
    assert "**Interrupted**" in render_markdown(data)


def test_rounds_are_paired_round_by_round_and_reported():
    """With --repeats each (prompt, round) is its own paired unit: a round's plain rate pairs
    with the same round's candidate, never with another round's."""
    recs = []
    for rnd, (plain, fast) in enumerate([(10.0, 20.0), (20.0, 40.0)]):
        for r in (rec("none", "p1", "summarization", plain, 2.0),
                  rec("ngram", "p1", "summarization", fast, 1.0, drafted=4, accepted=3)):
            r["round"] = rnd
            recs.append(r)
    run = run_dict(recs)
    run["matrix"]["repeats"] = 2
    cell = speedup_table(run)[OVERALL]["ngram"]
    assert cell.decode.estimate == pytest.approx(2.0)  # 2x in each round; 1x or 4x if crossed
    assert cell.decode.n == 2
    assert cell.missing == 0
    md = render_markdown(run)
    assert "1 prompts, 1 turns, each measured in 2 rounds" in md
