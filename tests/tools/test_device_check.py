"""tools/device_check.py: the dry run goes through every stage on this CPU machine (SmolLM2-135M,
the CPU backend, nothing compiled) and leaves a report with a status for each; the helpers
that move models to an offline GPU machine in parts (split, join, pin check) work on real files."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "device_check.py"
MODEL = Path.home() / ".cache" / "edgespec" / "models" / "smollm2-135m.gguf"


def _module():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not MODEL.is_file(), reason="needs smollm2-135m (edgespec models pull smollm2-135m)")
def test_dry_run_reports_every_stage(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    p = subprocess.run([sys.executable, str(SCRIPT), "run", "--dry-run", "--fresh", "--work", str(work),
                        "--out", str(out), "--deadline", "500"],
                       capture_output=True, text=True, timeout=560)
    rep = json.loads((out / "report.json").read_text())
    stages = rep["stages"]
    mod = _module()
    assert list(stages) == list(mod.STAGES), p.stdout + p.stderr
    for name, s in stages.items():
        assert s["status"] in ("ok", "skipped", "failed", "timeout") and s["summary"], name
        assert isinstance(s["seconds"], float) and s["seconds"] <= s["budget_s"] + 5
        # the newer proposers (self, lookahead) are being built beside this check: their
        # stage reports what the engine said; every other stage must pass here
        if name != "proposers":
            assert s["status"] in ("ok", "skipped"), (name, s.get("summary"), p.stdout[-3000:])
    assert p.returncode == (0 if stages["proposers"]["status"] in ("ok", "skipped") else 1)
    cal = stages["calibrate"]["details"]["calibration"]
    assert cal["points"][0] == [1, 1.0] and cal["exact_max_tokens"] >= 1
    res = stages["bench"]["details"]["results"]
    assert {"none", "draft", "ngram", "suffix"} <= set(res)
    assert all(r["decode_tok_s"] > 0 and r["requests"] >= 1 for r in res.values())
    assert "tree_width = 2" in stages["trees"]["details"]["matrix"]
    mtp = stages["proposers"]["details"].get("mtp", {})  # the tiny NextN GGUF, plumbing
    if stages["proposers"]["status"] == "ok":
        assert {"none", "mtp"} <= set(mtp["results"]) and "tiny-mtp.gguf" in mtp["matrix"]
    md = (out / "report.md").read_text()
    for name in mod.STAGES:
        assert f"| {name} | {stages[name]['status']} |" in md
    assert (out / "bench-bench.json").is_file() and (out / "log.txt").is_file()
    # a second invocation adds to the same report instead of starting over
    p2 = subprocess.run([sys.executable, str(SCRIPT), "run", "--dry-run", "--work", str(work),
                         "--out", str(out), "--stages", "env"], capture_output=True, text=True, timeout=120)
    assert p2.returncode == 0
    rep2 = json.loads((out / "report.json").read_text())
    assert len(rep2["invocations"]) == 2 and rep2["stages"]["bench"] == stages["bench"]


def test_a_stage_out_of_time_is_reported_not_fatal(tmp_path):
    out, report = tmp_path / "out", tmp_path / "elsewhere" / "gpu.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "run", "--dry-run", "--fresh", "--work",
                        str(tmp_path / "w"), "--out", str(out), "--json", str(report),
                        "--bundle", str(tmp_path / "no-bundle"), "--stages", "env,models,calibrate",
                        "--target", "no-such-model"], capture_output=True, text=True, timeout=120)
    stages = json.loads(report.read_text())["stages"]  # the JSON goes where --json says
    assert not (out / "report.json").exists() and (out / "report.md").is_file()
    assert stages["env"]["status"] == "ok"
    assert stages["models"]["status"] == "failed" and "no-such-model" in stages["models"]["summary"]
    assert stages["calibrate"]["status"] == "skipped"
    assert p.returncode == 1
    # the results are printed too, one line per stage
    assert "[gpu-check] env: ok" in p.stdout and "[gpu-check] models: failed" in p.stdout


def test_parts_join_only_to_the_pinned_digest(tmp_path):
    mod = _module()
    data = bytes(range(256)) * 1000
    src = tmp_path / "m.gguf"
    src.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    parts = mod.split_model(src, "tiny", sha, tmp_path / "parts", part_bytes=100_000)
    assert len(parts) == 3
    store, models = tmp_path / "store", tmp_path / "models"
    models.mkdir()
    # two of three parts carried so far: nothing joined yet
    (tmp_path / "carried").mkdir()
    for name in parts[:2]:
        (tmp_path / "carried" / name).write_bytes((tmp_path / "parts" / name).read_bytes())
    mod._store_parts(tmp_path / "carried", store)
    pins = {"tiny": {"sha256": sha, "size": len(data)}}
    assert mod._join_parts(store, models, pins) == {"tiny": "2 of 3 parts so far"}
    # parts arrive a few at a time; those already stored are not copied again
    assert mod._store_parts(tmp_path / "parts", store) == [parts[2]]
    assert mod._join_parts(store, models, pins) == {"tiny": "joined and verified"}
    assert (models / "tiny.gguf").read_bytes() == data
    # a pin that the parts do not match: nothing is kept
    bad = {"tiny": {"sha256": sha[:16] + "0" * 48, "size": len(data)}}
    (models / "tiny.gguf").unlink()
    assert "not the pin's" in mod._join_parts(store, models, bad)["tiny"]
    assert not (models / "tiny.gguf").exists()
