"""The planner and a target's own NextN (MTP) head: its memory, its cost per draft token,
and auto weighing it only on a target whose header has NextN layers (fakes: no model)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from edgespec import registry
from edgespec.api.labels import AUTO
from edgespec.calibration.curve import Calibration, prior_step_seconds
from edgespec.planner import nextn_head
from edgespec.planner.memory import estimate_memory, layer_kv_bytes, pad_ctx
from edgespec.planner.search import BudgetError, _kinds, plan
from edgespec.planner.speed import head_speed, speed_model
from edgespec.proposers import REGISTRY
from edgespec.runtime.kernel import KernelConfig
from tests.fakes.planner import FAST_GPU, GiB, MiB, QWEN_15, cpu, facts, gpu

# Qwen-1.5B-shaped, with one NextN block appended (29 blocks, the last the head)
NEXTN = replace(facts("nextn", layers=29), nextn_predict_layers=1)
FLAT = {"verify_costs": FAST_GPU["verify_costs"], "step_ms": 8}


def items(mem):
    return {i.name: i for i in mem.items}


def test_the_trunk_leaves_out_the_head_and_the_head_is_counted_only_for_mtp():
    k = KernelConfig()
    plain = items(estimate_memory(NEXTN, n_ctx=4096, kernel=k))
    with_head = items(estimate_memory(NEXTN, n_ctx=4096, kernel=k, mtp_head=True))
    assert "mtp head weights" not in plain
    assert with_head["mtp head weights"].host == NEXTN.mtp_bytes == NEXTN.layer_bytes[-1]
    # the target context caches the trunk's 28 layers, the MTP context the head's one
    assert plain["target KV cache"].host == estimate_memory(
        facts(layers=28), n_ctx=4096, kernel=k).items[4].host
    assert with_head["mtp KV cache"].host == int(layer_kv_bytes(NEXTN, 28, pad_ctx(4096), k.kv_type))
    assert nextn_head.trunk(QWEN_15) is QWEN_15  # no NextN layers: unchanged


def test_plan_with_mtp_shows_the_head_and_refuses_what_does_not_fit():
    p = plan(NEXTN, device=cpu(), proposer="mtp", ctx=4096)
    assert p.proposer == "mtp" and "mtp head weights" in p.memory.table()
    assert "mtp KV cache" in items(p.memory)
    # the least the search can try: batch 128, weights read into RAM, the asked KV type
    least = replace(p.kernel, n_batch=128, use_mmap=False)
    without = estimate_memory(NEXTN, n_ctx=4096, kernel=least, isa=("avx2",)).host
    with pytest.raises(BudgetError):  # fits without the head, not with it
        plan(NEXTN, device=cpu(), proposer="mtp", ctx=4096, kv_type=p.kernel.kv_type,
             budget=without + NEXTN.mtp_bytes // 2)
    assert plan(NEXTN, device=cpu(), proposer="none", ctx=4096, kv_type=p.kernel.kv_type,
                budget=without + NEXTN.mtp_bytes // 2).proposer == "none"


def test_auto_weighs_mtp_only_on_a_target_with_nextn_layers():
    assert ("mtp", False) in _kinds(AUTO, has_draft=False, nextn_layers=1)
    assert "mtp" not in [k for k, _ in _kinds(AUTO, has_draft=True, nextn_layers=0)]
    assert "mtp" not in [c.proposer for c in plan(QWEN_15, device=cpu()).candidates]
    assert "mtp" in [c.proposer for c in plan(NEXTN, device=cpu()).candidates]
    for name in ("self", "lookahead"):  # asked-only whatever the target
        assert not REGISTRY[name].weighable(0) and not REGISTRY[name].weighable(1)
    assert REGISTRY["mtp"].weighable(1) and not REGISTRY["mtp"].weighable(0)
    assert REGISTRY["ngram"].weighable(0) and REGISTRY["ngram"].weighable(3)


def test_auto_picks_mtp_only_where_the_speed_model_says_it_pays():
    on_gpu = plan(NEXTN, device=gpu(40 * GiB, speed=FLAT))  # flat verify curve
    assert on_gpu.proposer == "mtp" and on_gpu.draft is None
    assert "mtp" in on_gpu.config.proposer.split("+")
    assert any("draft cost" in r and "MTP head" in r for r in on_gpu.reasons)
    assert "mtp head weights" in items(on_gpu.memory)
    on_cpu = plan(NEXTN, device=cpu())  # the 2-core CPU prior: verifying is dear
    assert on_cpu.proposer != "mtp" and "mtp" not in on_cpu.config.proposer.split("+")
    lost = next(c for c in on_cpu.candidates if c.proposer == "mtp")
    assert lost.fits and lost.acceptance.source.startswith("prior")
    assert any(r.startswith("not mtp") for r in on_cpu.reasons)


def test_mtp_drafts_are_priced_with_the_head_cost_measured_at_calibration():
    expected = prior_step_seconds(nextn_head.trunk(NEXTN).weight_bytes)
    cal = replace(Calibration.prior_cpu(step_seconds=expected), source="measured",
                  mtp_step_seconds=expected / 10)
    sm = speed_model(cpu(synthetic=False), NEXTN, None, n_gpu_layers=0, draft_gpu_layers=0,
                     target_cal=cal)
    measured = head_speed(sm, NEXTN, cal)
    assert measured.draft_ratio == pytest.approx(0.1) and "measured" in measured.draft_source
    prior = head_speed(sm, NEXTN, replace(cal, mtp_step_seconds=None))
    assert prior.draft_ratio == pytest.approx(nextn_head.head_step_ratio(NEXTN))
    assert prior.draft_source.startswith("prior")
    busy = head_speed(sm, NEXTN, replace(cal, busy=0.9))  # an untrusted calibration: the prior
    assert busy.draft_ratio == prior.draft_ratio


def test_a_qualification_record_replaces_the_acceptance_prior(monkeypatch):
    seen = []

    def qualification(target, key):
        seen.append((target, key))
        return {"coding": {"acceptance": 0.9, "coverage": 1.0}}

    monkeypatch.setattr(registry, "qualification", qualification)
    p = plan(NEXTN, device=cpu(), proposer="mtp", target_name="sha-keyed.gguf")
    assert ("sha-keyed.gguf", "mtp") in seen
    assert p.candidates[0].acceptance.alpha == 0.9
    assert p.candidates[0].acceptance.source.startswith("qualification")


def test_the_head_prior_reads_the_output_matrix_unless_the_head_has_its_own():
    ratio = nextn_head.head_step_ratio(NEXTN)
    assert ratio == pytest.approx((NEXTN.mtp_bytes + NEXTN.output_bytes)
                                  / (NEXTN.weight_bytes - NEXTN.mtp_bytes))
    assert 0 < ratio < 1 and MiB < NEXTN.mtp_bytes
