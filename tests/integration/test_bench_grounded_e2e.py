"""`edgespec bench --preset grounded-quick` for real on smollm2-135m: the stdlib prompts through
the CLI, the engine's plain path and default, bench.json with the sources' digests, and the
report's grounded section per task and per agent turn. 8 tokens, plain + default only (fast):
a smoke run, not a measurement."""
from __future__ import annotations

import json
import os
import sys

from click.testing import CliRunner

from edgespec.lab.bench import grounded
from edgespec.cli import cli

TARGET = "smollm2-135m"
THREADS = os.environ.get("EDGESPEC_TEST_THREADS", "2")


def test_grounded_quick_runs_every_turn_and_reports_per_task_and_turn(model_path, tmp_path):
    path = model_path(TARGET)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [
        "bench", "--preset", "grounded-quick", "--target", str(path), "--proposer", "auto",
        "--no-anchor", "--max-tokens", "8", "--warmup", "0", "--threads", THREADS,
        "--ctx", "2048", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "bench.json").read_text())
    assert [c["label"] for c in data["matrix"]["configs"]] == ["none", "auto"]
    assert data["matrix"]["grounded"] == "quick"
    info = data["identity"]["grounded"]
    assert info["python"] == sys.version.split()[0] and info["set"] == "quick"
    expected = grounded.build("quick")
    assert [u["sha256"] for u in info["used"]] == [u.sha256 for u in expected.used]
    recs = data["records"]
    assert all("error" not in r for r in recs), [r.get("error") for r in recs]
    units = {(r["prompt_id"], r["turn"]) for r in recs}
    assert units == {(p.id, t) for p in expected.prompts for t in range(len(p.turns))}
    assert len(recs) == 2 * len(units)
    assert all(r["source"] == "grounded" and 1 <= r["generated_tokens"] <= 8 for r in recs)
    # a later agent turn's prompt holds the earlier turns and answers: it is longer
    agent = sorted((r["turn"], r["prompt_tokens"]) for r in recs
                   if r["config"] == "none" and r["category"] == "grounded-agent")
    assert len(agent) == 3 and agent[0][1] < agent[1][1] < agent[2][1]
    assert all(r["parity"] for r in recs if r["config"] == "auto")
    report = (out / "report.md").read_text()
    assert "## Grounded slice (Python standard library)" in report
    assert "| grounded-fix-bug |" in report and "| turn 3 |" in report
    assert "Planted bug in `fix-bug/statistics.median`" in report
