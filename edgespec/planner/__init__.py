"""The memory- and speed-budget planner: which proposer, how much offload, what context,
which kernel configuration.

A plan answers, for one target (and optionally a draft model) on one device: does it
fit, and which way of speculating is predicted to be fastest? It never loads weights
to decide: model sizes come from GGUF headers (:mod:`edgespec.runtime.gguf_facts`), the device
from :mod:`edgespec.runtime.device`, costs and exactness caps from the calibration cache
(:mod:`edgespec.calibration`), expected acceptance from the registry's qualification
results when they exist.

    memory.py      the memory model (per component, host and GPU), for a KernelConfig
    repack.py      which weights llama.cpp repacks, what stays mapped
    speed.py       predicted speedup per proposer and draft length, the cost curve's source
    trust.py       whether a cached calibration measured the device or its load
    acceptance_priors.py  expected acceptance: qualification results, else defaults
    search.py      plan(): the first configuration that fits, the fastest proposer
    reasons.py     the plan's "why"
    result.py      Plan, Candidate, Exactness
    entry.py       plan_engine(EngineConfig) and plan_for(names): I/O in, Plan out
    lookup.py      registry names to files, cached calibrations, pulled drafts
    rss.py         planned vs measured RSS (this process, or a fresh one)
    remote.py      the RPC split: which layers each remote device holds, and whether they fit

    plan = planner.plan_engine(EngineConfig(target="qwen-1.5b"))
    plan.config          # the EngineConfig to load, nothing left "auto"
    print(plan.explain())
    planner.check_memory(plan, "load").report()   # after loading: planned vs RSS
"""
from __future__ import annotations

from .acceptance_priors import DEFAULT_ACCEPTANCE, Acceptance, acceptance_for
from .entry import UNPROBED_EXACT_CAP, plan_engine, plan_for, resolve_rpc
from .lookup import cached_calibration, registered_draft, resolve_model
from ..runtime.kernel import KV_GGML_TYPE, KV_TYPES
from .memory import (CTX_PAD, DEFAULT_BATCH, ENGINE_BYTES, GPU_RUNTIME_BYTES, K_MAX,
                     KV_BYTES_PER_ELEMENT, NGRAM_BYTES_PER_TOKEN,
                     RUNTIME_BYTES, SUFFIX_CACHE_CAP, MemoryEstimate, MemoryItem, compute_bytes,
                     default_budgets, estimate_memory, gpu_layer_start, host_weights, kv_bytes,
                     model_memory, pad_ctx, weight_bytes)
from .result import Candidate, Exactness, KernelOption, Plan
from .rss import MemoryCheck, check_memory, current_rss, measure_memory, measure_plan
from .search import BATCH_CHOICES, DEFAULT_CTX, MIN_CTX, BudgetError, plan
from .speed import (DRAFT_LEN_SLACK, SpeedModel, best_k, break_even_alpha,
                    expected_tokens, predicted_speedup, speed_model)
from .trust import MAX_CALIBRATION_SPREAD, calibration_trust, usable_shape

__all__ = [
    "BATCH_CHOICES", "CTX_PAD", "DEFAULT_ACCEPTANCE", "DEFAULT_BATCH", "DEFAULT_CTX",
    "DRAFT_LEN_SLACK", "ENGINE_BYTES", "GPU_RUNTIME_BYTES", "KV_BYTES_PER_ELEMENT",
    "KV_GGML_TYPE", "KV_TYPES", "K_MAX", "MAX_CALIBRATION_SPREAD", "MIN_CTX",
    "NGRAM_BYTES_PER_TOKEN", "RUNTIME_BYTES", "SUFFIX_CACHE_CAP", "UNPROBED_EXACT_CAP",
    "Acceptance", "BudgetError", "Candidate", "Exactness", "KernelOption", "MemoryCheck",
    "MemoryEstimate", "MemoryItem", "Plan", "SpeedModel", "acceptance_for", "best_k",
    "break_even_alpha", "cached_calibration", "calibration_trust", "check_memory", "usable_shape",
    "compute_bytes", "current_rss", "default_budgets", "estimate_memory", "expected_tokens",
    "gpu_layer_start", "host_weights", "kv_bytes", "measure_memory", "measure_plan",
    "model_memory", "pad_ctx", "plan", "plan_engine", "plan_for", "predicted_speedup",
    "registered_draft", "resolve_model", "resolve_rpc", "speed_model", "weight_bytes",
]
