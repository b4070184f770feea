"""The planner's memory estimate against the RSS of a fresh process, in the engine's own
kernel configuration (repacked weights, flash attention, Q8_0 KV cache, mmap).

Defect this guards (issue 11): `make demo` printed "planned 1.2 GiB, measured RSS 1.79 GiB
(-32.9%)" for Qwen 1.5B, because the estimate left out the repacked copy of the Q4_K
matrices that sits beside the mapped file's pages. Qwen 1.5B is the model that shows it
(SmolLM2's Q4_1/Q8_0 weights have no repacked kernel on x86), so it runs by default.

Tolerance: ±10% at both points (after loading; at the peak), in a subprocess so the RSS
is the model's alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from edgespec import planner
from edgespec.config import EngineConfig
from edgespec.runtime.kernel import KernelConfig
from edgespec.runtime.device import fmt_size, probe

TOLERANCE = 0.10
ROOT = Path(__file__).resolve().parents[2]


def _plan(target, draft=None, ctx=4096, kernel=None) -> planner.Plan:
    """The plan for fixed settings in the engine's kernel configuration (unless given),
    weights loaded as that kernel says (mapped unless it says otherwise)."""
    kernel = kernel or KernelConfig()
    cfg = EngineConfig(target=str(target), draft=str(draft) if draft else None,
                       proposer="draft" if draft else "none", kernel=kernel,
                       n_ctx=ctx, threads=2, use_mmap=kernel.use_mmap)
    p = planner.plan_engine(cfg, device=probe(with_accelerators=False))
    assert p.kernel.kv_type == (kernel or KernelConfig()).kv_type
    return p


def _check(p: planner.Plan):
    checks = planner.measure_plan(p, n_threads=2)
    for c in checks:
        print(c.report())
        assert abs(c.error) <= TOLERANCE, (
            f"{c.stage}: planned {fmt_size(c.planned_host)} vs measured {fmt_size(c.measured_host)}")
    return checks


def test_qwen_estimate_matches_rss_with_repacked_weights(model_path):
    p = _plan(model_path("qwen-1.5b"))
    assert p.kernel.repack and p.kernel.flash_attn and p.kernel.use_mmap
    repacked = next(i for i in p.memory.items if i.name == "target repacked")
    assert repacked.host > 500 * 2**20  # the Q4_K matrices' copy, beside the mapped pages
    _check(p)


def test_reading_weights_into_ram_saves_the_repacked_copy(model_path):
    mapped = _plan(model_path("qwen-1.5b"))
    ram = _plan(model_path("qwen-1.5b"), kernel=KernelConfig(use_mmap=False))
    measured = _check(ram)
    assert mapped.memory.host_at_load - ram.memory.host_at_load > 500 * 2**20
    assert measured[0].measured_host < mapped.memory.host_at_load - 400 * 2**20


def test_engine_load_matches_its_plan(model_path):
    """What `generate --stats` prints ("[plan] memory at load"), in a fresh process."""
    code = (
        "import json, sys\n"
        "from edgespec import planner\n"
        "from edgespec.config import EngineConfig\n"
        "from edgespec.engine import Engine\n"
        "cfg = EngineConfig(target=sys.argv[1], proposer='auto', n_ctx=4096, threads=2,\n"
        "                   adaptive=False, budget='64GiB')\n"
        "eng = Engine.from_config(cfg)\n"
        "c = planner.check_memory(eng.plan, 'load')\n"
        "print(json.dumps({'planned': c.planned_host, 'measured': c.measured_host,\n"
        "                  'report': c.report()}))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, str(model_path("qwen-1.5b"))],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(r["report"])
    assert abs(r["planned"] - r["measured"]) / r["measured"] <= TOLERANCE, r["report"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen-0.5b", "gemma-270m", "smollm2-135m"])
def test_estimate_matches_rss(model_path, name):
    _check(_plan(model_path(name)))


@pytest.mark.slow
def test_f16_kv_and_long_context(model_path):
    _check(_plan(model_path("qwen-0.5b"), ctx=16384, kernel=replace(KernelConfig(), kv_type="f16")))


@pytest.mark.slow
def test_target_and_draft_in_one_process(model_path):
    _check(_plan(model_path("qwen-1.5b"), model_path("qwen-0.5b")))
