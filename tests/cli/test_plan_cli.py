"""`edgespec plan` through click's CliRunner, on model paths (headers only: fast)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgespec.cli import cli


def run(*args):
    result = CliRunner().invoke(cli, ["plan", *args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def qwen(model_path):
    return str(model_path("qwen-1.5b")), str(model_path("qwen-0.5b"))


def test_plan_on_this_machine_explains_why_the_draft_loses(qwen):
    t, d = qwen
    r = run("--target", t, "--draft", d)
    assert r.exit_code == 0, r.output
    assert "proposer   suffix" in r.output or "proposer   ngram" in r.output
    assert "not draft" in r.output and "target weights" in r.output


def test_plan_on_a_described_gpu_picks_the_draft(qwen, tmp_path):
    t, d = qwen
    spec = tmp_path / "gpu.json"
    spec.write_text(json.dumps({"name": "gpu box", "gpus": [{"name": "GPU", "free": "8GiB"}],
                                "speed": {"verify_costs": {"2": 1.02, "8": 1.1, "16": 1.25},
                                          "draft_step_ratio": 0.15}}))
    r = run("--target", t, "--draft", d, "--device-json", str(spec), "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["proposer"] == "draft" and plan["n_gpu_layers"] == 29
    assert {c["proposer"] for c in plan["candidates"]} == {"none", "ngram", "suffix", "draft"}


def test_budget_too_small_is_a_clean_error(qwen):
    r = run("--target", qwen[0], "--budget", "512MiB")
    assert r.exit_code == 1
    assert "does not fit" in r.output and "raise --budget to at least" in r.output


@pytest.mark.parametrize("args,msg", [(["--budget", "lots"], "not a memory size"),
                                      (["--ctx", "100000"], "trained for")])
def test_bad_input(qwen, args, msg):
    r = run("--target", qwen[0], *args)
    assert r.exit_code != 0 and msg in r.output


def test_verify_refuses_a_described_device(qwen, tmp_path):
    spec = tmp_path / "d.json"
    spec.write_text("{}")
    r = run("--target", qwen[0], "--device-json", str(spec), "--verify")
    assert r.exit_code == 2 and "--device-json" in r.output
