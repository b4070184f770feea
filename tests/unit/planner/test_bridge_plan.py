"""The planner and a bridged draft: weighed with the bridge's own costs, explained, picked
only where it pays (synthetic devices and GGUF facts, as in test_planner.py)."""
from __future__ import annotations

import pytest

from edgespec import planner
from edgespec.planner import Acceptance
from edgespec.planner.speed import BRIDGE_DRAFT_PER_TARGET, bridged

from fakes.planner import FAST_GPU, QWEN_05, QWEN_15, cpu, facts, gpu

SMOL = facts("smollm2", layers=30, embd=576, ff=1536, kv=3, hd=64, vocab=49152, merges=48900,
             layer_bytes=2_900_000, embd_bytes=15_000_000, out_bytes=0)


def _by(plan):
    return {c.proposer: c for c in plan.candidates}


def test_a_cross_vocabulary_draft_is_a_bridge_candidate_not_a_draft_one():
    by = _by(planner.plan(QWEN_15, SMOL, device=cpu()))
    assert not by["draft"].fits and "--proposer bridge" in by["draft"].note
    assert by["bridge"].fits


def test_a_same_vocabulary_draft_needs_no_bridge():
    by = _by(planner.plan(QWEN_15, QWEN_05, device=cpu()))
    assert by["draft"].fits and "bridge" not in by  # not weighed under auto
    asked = _by(planner.plan(QWEN_15, QWEN_05, device=cpu(), proposer="ngram+bridge"))
    assert not asked["bridge"].fits and "needs no bridge" in asked["bridge"].note


def test_the_bridge_costs_more_than_the_same_draft_without_it():
    sm = planner.plan(QWEN_15, SMOL, device=cpu()).candidates[0].config["speed"]
    b = bridged(sm)
    assert b.draft_ratio == pytest.approx(sm.draft_ratio * BRIDGE_DRAFT_PER_TARGET)
    assert b.cost(4) > sm.cost(4) and b.cost(1) == sm.cost(1)
    assert "measured apart from draft inference" in b.draft_source


def test_on_this_cpu_the_bridge_does_not_pay_and_the_plan_says_why():
    p = planner.plan(QWEN_15, SMOL, device=cpu())
    assert p.proposer != "bridge"
    why = "\n".join(p.reasons)
    assert "not bridge:" in why and "bridged:" in why and "of a target step" in why


def test_where_drafting_is_cheap_and_accepted_the_bridge_is_chosen(monkeypatch):
    def acc(kind, target_name, draft_name=None):
        return Acceptance(0.9, 1.0, "qualification (2 slices)") if kind == "bridge" else \
            planner.DEFAULT_ACCEPTANCE[kind]

    monkeypatch.setattr(planner.search, "acceptance_for", acc)
    p = planner.plan(QWEN_15, SMOL, device=gpu(8 * 2**30, speed=FAST_GPU))
    assert p.proposer == "bridge" and p.config.draft is not None
    assert "bridge" in p.config.proposer.split("+")
