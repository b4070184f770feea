"""`edgespec plan` through click's CliRunner, on model paths (headers only: fast)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgespec.cli import cli
from edgespec.runtime.kernel import KernelConfig


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


# --- the plan shown is the plan that runs (issue 11) and what --exact verifies (issue 12) -------
@pytest.fixture
def smol(model_path, tmp_path, monkeypatch):
    """A model path, and an empty EDGESPEC_HOME so no calibration is cached."""
    path = str(model_path("smollm2-135m"))
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    return path


def test_plan_shows_the_kv_type_and_kernel_the_engine_runs(smol):
    """Defect: `edgespec plan` planned an F16 KV cache while `generate` ran Q8_0. The default
    mode runs the fastest kernel measured here (the engine measures it once), exact mode the
    batch-invariant Q8_0 + flash attention; the plan shows each as the engine runs it."""
    from edgespec.config import EngineConfig
    from edgespec.engine.engine import Engine

    with Engine.from_config(EngineConfig(target=smol, proposer="ngram")) as eng:
        engine = eng.config.kernel
    r = run("--target", smol, "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["kv_type"] == engine.kv_type
    assert plan["kernel"] == {"repack": engine.repack, "flash_attn": engine.flash_attn,
                              "kv_type": engine.kv_type, "n_batch": engine.n_batch,
                              "use_mmap": engine.use_mmap}
    assert len(plan["kernel_choice"]) == 2  # every candidate, measured, the chosen one marked
    text = run("--target", smol).output
    assert f"KV cache {engine.kv_type}" in text and "repacked weights" in text
    assert "default mode's kernel" in text and "step" in text
    exact = json.loads(run("--target", smol, "--exact", "--json").output)
    assert exact["kv_type"] == "q8_0" and exact["kernel"]["flash_attn"]
    with Engine.from_config(EngineConfig(target=smol, proposer="ngram", exact=True)) as eng:
        # weights read into RAM where huge pages are available (EngineConfig.loaded_as)
        assert eng.config.kernel == eng.config.loaded_as(KernelConfig())


def test_plan_takes_generate_flags_including_exact(smol):
    """Defect: `edgespec plan` had no --exact (nor --proposer, --threads...)."""
    r = run("--target", smol, "--exact", "--proposer", "ngram", "--threads", "2", "--ctx", "1024",
            "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["exact"] and plan["runs"] == "ngram" and plan["n_ctx"] == 1024
    assert plan["draft_range"][1] <= 2  # exact mode without a probe: the engine's fallback cap
    assert "exactness" in plan and plan["exactness"]["options"][0]["cap"] is None


def test_plan_without_a_calibration_says_how_to_measure_the_exact_cap(smol):
    r = run("--target", smol)
    assert r.exit_code == 0, r.output
    assert "cap not measured on this device yet" in r.output and "edgespec plan --calibrate" in r.output


def _fake_measure(caps):
    """calibration.load_or_measure that 'measures' a trusted curve with a per-layout cap."""
    from edgespec.calibration.curve import Calibration, prior_step_seconds
    from edgespec.runtime.gguf_facts import read_facts

    def measure(path, *, n_threads=None, sha256=None, force=False, kernel=None, **_):
        step = prior_step_seconds(read_facts(path).weight_bytes)
        costs = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.6, 8: 2.2, 16: 3.0}
        return Calibration(step_seconds=step, points=tuple(costs.items()), source="measured",
                           samples={n: (step * c,) * 5 for n, c in costs.items()},
                           exact_max_tokens=caps[kernel.repack])
    return measure


def test_plan_calibrate_shows_the_probed_cap_and_the_layout_exact_mode_uses(smol, monkeypatch):
    from edgespec.calibration import cache as calibration

    calls = []
    fake = _fake_measure({True: 3, False: 9})
    monkeypatch.setattr(calibration, "load_or_measure",
                        lambda *a, **k: calls.append(k["kernel"].repack) or fake(*a, **k))
    r = run("--target", smol, "--exact", "--calibrate")
    assert r.exit_code == 0, r.output
    assert sorted(calls) == [False, True]  # exact mode measures both layouts to choose
    assert "repacked weights: cap 2 drafts a pass (3-token verify)" in r.output
    assert "exact *   plain weights: cap 8 drafts a pass (9-token verify)" in r.output
    assert "kernel     plain weights" in r.output  # same curve, longer exact passes: it wins
    calls.clear()
    monkeypatch.setattr(calibration, "load_or_measure",
                        lambda *a, **k: calls.append((k["kernel"].repack, k["kernel"].kv_type,
                                                      k["kernel"].flash_attn)) or fake(*a, **k))
    r = run("--target", smol, "--calibrate", "--json")
    plan = json.loads(r.output)
    k = plan["kernel"]
    # the exact layout's curve (for the exact rows), then the default kernel's own curve
    # when the measured default is not the exact configuration
    own = [] if (k["kv_type"], k["flash_attn"]) == ("q8_0", True) else [(True, k["kv_type"], k["flash_attn"])]
    assert calls == [(True, "q8_0", True)] + own and not plan["exact"] and k["repack"]
    opts = {o["repack"]: o for o in plan["exactness"]["options"]}
    assert opts[True]["cap"] == 2 and opts[True]["chosen"] and opts[False]["cap"] is None
