"""The planner's memory estimate against the RSS of a fresh process that loads each real model
with a context, prefills a full batch and runs one verify pass (planner.measure_plan).

Tolerance: ±15% at both points (after loading; at the peak). Measured in a subprocess so the
RSS is the model's alone. The three larger models take minutes on 2 cores: slow."""
from __future__ import annotations

import pytest

from edgespec import planner
from edgespec.device import fmt_size
from edgespec.gguf_facts import read_facts

TOLERANCE = 0.15


def _plan(target, draft=None, ctx=4096, kv="f16", n_batch=512) -> planner.Plan:
    """A CPU plan with fixed settings (the planner's own choices are tested elsewhere)."""
    t = read_facts(target)
    d = read_facts(draft) if draft else None
    mem = planner.estimate_memory(t, n_ctx=ctx, kv_type=kv, n_batch=n_batch, draft=d,
                                  verify_rows=planner.K_MAX + 1)
    base = planner.plan(t, device=planner.devmod.probe(with_accelerators=False), ctx=ctx)
    return planner.replace(base, draft=str(draft) if draft else None, proposer="draft" if draft else "none",
                           n_ctx=ctx, kv_type=kv, n_batch=n_batch, n_gpu_layers=0,
                           draft_gpu_layers=0, memory=mem)


def _check(p: planner.Plan):
    checks = planner.measure_plan(p, n_threads=2)
    for c in checks:
        print(c.report())
        assert abs(c.error) <= TOLERANCE, (
            f"{c.stage}: planned {fmt_size(c.planned_host)} vs measured {fmt_size(c.measured_host)}")
    return checks


def test_smollm2_estimate_matches_rss(model_path):
    _check(_plan(model_path("smollm2-135m"), ctx=2048, n_batch=128))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen-1.5b", "qwen-0.5b", "gemma-270m", "smollm2-135m"])
def test_estimate_matches_rss(model_path, name):
    _check(_plan(model_path(name)))


@pytest.mark.slow
def test_quantized_kv_and_long_context(model_path):
    _check(_plan(model_path("qwen-0.5b"), ctx=16384, kv="q8_0"))


@pytest.mark.slow
def test_target_and_draft_in_one_process(model_path):
    _check(_plan(model_path("qwen-1.5b"), model_path("qwen-0.5b")))
