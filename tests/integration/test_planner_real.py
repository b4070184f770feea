"""The planner on the real registry models (pulled): this machine and a described GPU."""
from __future__ import annotations

import json

from edgespec.runtime import device as devmod
from edgespec import planner
from edgespec.proposers import free_names

FAST_GPU = {"verify_costs": {"2": 1.02, "4": 1.05, "8": 1.1, "16": 1.25}, "step_ms": 8,
            "draft_step_ratio": 0.15}


def test_plan_for_real_models_on_this_machine_and_a_described_gpu(model_path, tmp_path):
    t, d = str(model_path("qwen-1.5b")), str(model_path("qwen-0.5b"))
    here = planner.plan_for(t, d, device=devmod.probe())
    # on a CPU the 0.5B draft cannot pay: what runs is the free proposers, under adaptive
    # control (which takes plain steps where they do not pay), and no draft model is loaded
    assert here.proposer != "draft" and here.config.draft is None
    assert set(here.config.proposer.split("+")) == set(free_names())
    spec = tmp_path / "gpu.json"
    spec.write_text(json.dumps({"gpus": [{"name": "GPU", "free": "8GiB"}], "speed": FAST_GPU}))
    there = planner.plan_for(t, d, device=devmod.from_json(spec))
    assert there.proposer == "draft" and there.draft == d
    assert there.n_gpu_layers == 29 and there.draft_gpu_layers == 25


