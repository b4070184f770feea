"""--parallel N: the planner counts N sequences of KV cells against the budget."""
from __future__ import annotations

import pytest

from edgespec import planner
from edgespec.config import EngineConfig

from fakes.planner import QWEN_15, cpu


def _kv(plan) -> int:
    return next(i.host for i in plan.memory.items if i.name == "target KV cache")


def test_parallel_sequences_multiply_the_kv_cache_in_the_plan():
    one = planner.plan(QWEN_15, device=cpu(), ctx=2048,
                       base=EngineConfig(target=str(QWEN_15.path)))
    four = planner.plan(QWEN_15, device=cpu(), ctx=2048,
                        base=EngineConfig(target=str(QWEN_15.path), parallel=4))
    assert _kv(four) == pytest.approx(4 * _kv(one), rel=0.02)
    assert four.memory.host > one.memory.host


def test_parallel_sequences_that_do_not_fit_shrink_the_context():
    base16 = EngineConfig(target=str(QWEN_15.path), parallel=16)
    roomy = planner.plan(QWEN_15, device=cpu(), ctx=4096, base=base16)
    budget = roomy.memory.host - 8 * _kv(roomy) // 16  # half the sequences' KV short
    alone = planner.plan(QWEN_15, device=cpu(), budget=budget,
                         base=EngineConfig(target=str(QWEN_15.path)))
    many = planner.plan(QWEN_15, device=cpu(), budget=budget, base=base16)
    # alone it fits as asked; 16 sequences must give something up (context, KV type, layout)
    assert alone.n_ctx == 4096 and alone.memory.host <= budget
    assert roomy.memory.host > budget >= many.memory.host
