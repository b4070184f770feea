"""A tiny real bench on smollm2-135m with --record, replayed: the replay must rebuild the
recorded passes exactly (same drafts, decisions, accepted counts, number of passes) through
the real adaptive controller and its goodput guard, and report an error figure. No bound
on that error is asserted: timings on a shared machine are noise."""
from __future__ import annotations

import json
import math
import os

from click.testing import CliRunner

from edgespec.lab.bench.matrix import ConfigSpec, Matrix
from edgespec.lab.bench.runner import run_bench
from edgespec.cli import cli
from edgespec.lab.replay import compare, load_traces
from edgespec.lab.replay.replay import fit, models, replay_run

THREADS = int(os.environ.get("EDGESPEC_TEST_THREADS", "2"))


def test_recorded_run_replays_pass_for_pass(model_path, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "rep", "category": "copy", "prompt": "Repeat exactly: red green blue, "
                    "red green blue, red green blue, red green blue."}) + "\n"
        + json.dumps({"id": "hi", "category": "chat", "prompt": "Say hello."}) + "\n")
    m = Matrix(target=str(model_path("smollm2-135m")), configs=(ConfigSpec("none"), ConfigSpec("ngram")),
               spec_bench=(), jsonl=(str(prompts),), max_new_tokens=32, threads=THREADS,
               n_ctx=512, warmup=1, record=True).validate()
    run = run_bench(m)
    assert not run.interrupted and all("error" not in r for r in run.records)
    out = tmp_path / "run"
    out.mkdir()
    (out / "bench.json").write_text(json.dumps(run.to_dict()))
    with open(out / "traces.jsonl", "w") as f:
        for line in run.trace_lines():
            f.write(json.dumps(line) + "\n")

    traces = load_traces(out)
    assert len(traces.requests) == 6  # 2 warm-ups + 2 prompts x 2 configurations, in run order
    assert [r["warmup"] for r in traces.requests[:2]] == [True, True]
    curve = traces.curve("default")
    assert len(curve.depths) >= 2 and curve.seconds(1, curve.depths[-1]) > 0
    ngram = [r for r in traces.measured if r["config"] == "ngram"]
    assert ngram and all(r["controller"]["settings"]["adaptive"] for r in ngram)
    assert any(p["candidates"] for r in ngram for p in r["passes"])
    for r in traces.measured:
        # the passes account for every decode second the bench measured
        total = sum(p["gap_seconds"] for p in r["passes"]) + r["tail_seconds"]
        assert math.isclose(total, r["decode_seconds"], rel_tol=1e-6, abs_tol=1e-6)

    over = fit(traces)
    for name, (model_for, ov) in models(traces, over).items():
        replayed = replay_run(traces, model_for, ov)
        assert len(replayed) == 4
        for got, rec in zip(replayed, traces.measured):
            want = [(p["rows"], p["depth"], p["drafted"], p["accepted"]) for p in rec["passes"]]
            assert got.passes == want, (name, rec["config"], rec["prompt_id"])
            assert got.reproduced and got.decode_tokens == rec["decode_tokens"]
            assert got.seconds > 0
    comp, _ = compare(traces)
    assert comp.reproduced == comp.replayed == 4
    rows = comp.rows["ngram"]
    assert {r["prompt"] for r in rows.values()} == {"p/rep", "p/hi"}
    assert all(math.isfinite(r["error"]) and r["measured"] > 0 for r in rows.values())

    res = CliRunner().invoke(cli, ["bench", "--replay", str(out)])
    assert res.exit_code == 0, res.output
    assert "for 4 of 4 requests" in res.output and "### ngram" in res.output
    assert "| ngram |" in res.output and "%" in res.output
    saved = json.loads((out / "replay.json").read_text())
    assert saved["reproduced"] == 4 and set(saved["variants"]) == set(comp.variants)

    # tools/replay_whatif.py: the recording's own controller first, then the variants asked
    import contextlib
    import io
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import replay_whatif
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert replay_whatif.main([str(out), "--config", "ngram", "--variant", "cal=curve",
                                   "--variant", "cal=curve,max_draft=1"]) == 0
    lines = buf.getvalue().splitlines()
    assert [ln.split()[0] for ln in lines] == ["cal=recorded", "cal=curve",
                                               "cal=curve,max_draft=1"]
    assert all("geomean" in ln and "copy:" in ln and "chat:" in ln for ln in lines)
    # the recording's controller on the model: its own passes, so the main comparison's figure
    assert float(lines[0].split("geomean")[1].split()[0]) > 0
    assert replay_whatif.main([str(out), "--config", "nothing"]) == 2
