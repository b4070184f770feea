"""Planned against measured memory: this process's RSS, or a fresh process that loads a plan."""
from __future__ import annotations

import json
import os
import subprocess as sp
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..runtime.kernel import KernelConfig
from ..runtime.device import fmt_size
from ..errors import EdgespecError
from .memory import K_MAX, MemoryEstimate
from .result import Plan
import psutil  # type: ignore[import-untyped]  # no stubs installed; used for RSS only

#: what measure_memory does not build (the engine's free proposers), left out of comparisons
NOT_MEASURED = ("engine", "suffix cache", "n-gram index")


@dataclass(frozen=True)
class MemoryCheck:
    """Planned against measured memory after loading."""
    stage: str                 # "load" (weights + KV) or "peak" (after a full batch and a verify pass)
    planned_host: int
    measured_host: int
    planned_device: int = 0
    measured_device: int | None = None

    @property
    def error(self) -> float:
        """(planned - measured) / measured: positive means the plan over-estimated."""
        return (self.planned_host - self.measured_host) / max(self.measured_host, 1)

    def report(self) -> str:
        s = (f"memory at {self.stage}: planned {fmt_size(self.planned_host)}, measured RSS "
             f"{fmt_size(self.measured_host)} ({self.error:+.1%})")
        if self.measured_device is not None:
            s += (f"; GPU planned {fmt_size(self.planned_device)}, measured "
                  f"{fmt_size(self.measured_device)}")
        return s


def current_rss(pid: int | None = None) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def check_memory(estimate: MemoryEstimate | Plan, stage: str = "peak", pid: int | None = None,
                 device_used: int | None = None) -> MemoryCheck:
    """Compare a plan's memory with this process's RSS (and GPU memory used, if given)."""
    est = estimate.memory if isinstance(estimate, Plan) else estimate
    planned = est.host if stage == "peak" else est.host_at_load
    return MemoryCheck(stage, planned, current_rss(pid), est.device, device_used)


def plan_job(p: Plan, n_threads: int | None = None) -> dict[str, Any]:
    """What :func:`measure_memory` needs to load ``p`` (plain JSON, for a child process)."""
    k = p.kernel
    return {"target": str(p.target), "draft": str(p.draft) if p.draft else None, "n_ctx": p.n_ctx,
            "n_gpu_layers": p.n_gpu_layers, "draft_gpu_layers": p.draft_gpu_layers,
            "n_threads": n_threads, "gpu": p.budget_device > 0 and not p.device.synthetic,
            "kernel": {"repack": k.repack, "flash_attn": k.flash_attn, "kv_type": k.kv_type,
                       "n_batch": k.n_batch, "use_mmap": k.use_mmap}}


def measure_plan(p: Plan, n_threads: int | None = None, subprocess: bool = True) -> list[MemoryCheck]:
    """Load what ``p`` plans, in its kernel configuration, and compare its memory estimate
    with the measured RSS.

    By default in a fresh Python process, so the RSS is the plan's alone. The free
    proposers' caches are not built here, so they are left out of the comparison.
    """
    est = p.memory.without(*NOT_MEASURED)
    job = plan_job(p, n_threads)
    if not subprocess:
        return _checks(est, measure_memory(job))
    code = ("import json, sys; from edgespec.planner import rss; "
            "print(json.dumps(rss.measure_memory(json.loads(sys.argv[1]))))")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = sp.run([sys.executable, "-c", code, json.dumps(job)], capture_output=True,
                         text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise EdgespecError(f"measuring the plan failed: {out.stderr.strip().splitlines()[-1:]}")
    return _checks(est, json.loads(out.stdout.strip().splitlines()[-1]))


def _checks(est: MemoryEstimate, measured: Mapping[str, Any]) -> list[MemoryCheck]:
    return [MemoryCheck("load", est.host_at_load, measured["rss_load"], est.device,
                        measured.get("gpu_load")),
            MemoryCheck("peak", est.host, measured["rss_peak"], est.device, measured.get("gpu_peak"))]


def measure_memory(job: Mapping[str, Any]) -> dict[str, Any]:
    """Load a target (+ draft) with one context each in *this* process and report its RSS.

    ``job`` (see :func:`plan_job`): target, draft, n_ctx, kernel, n_gpu_layers,
    draft_gpu_layers, n_threads, gpu. Both models load as the engine loads them (the
    kernel's repack and mmap; contexts with its flash attention, KV type and batch).
    RSS after loading ("rss_load") and after a full-batch prefill in each context plus
    one verify pass of K_MAX + 1 all-logits rows in the target's ("rss_peak"); with
    ``gpu``, the accelerator memory used at both points.
    """
    from ..runtime import backend, ggml_devices  # deferred: they load llama.cpp
    from ..runtime.model import load_model  # deferred: it loads llama.cpp

    kernel = KernelConfig(**job.get("kernel", {})).validate()

    def used_gpu() -> int | None:
        if not job.get("gpu"):
            return None
        return int(sum(d["total"] - d["free"] for d in ggml_devices.list_devices()
                       if d["type"] != "cpu"))

    backend.ensure_init()
    base_gpu = used_gpu() or 0
    models, ctxs = [], []
    out: dict[str, Any] = {}
    try:
        for path, layers in ((job["target"], job.get("n_gpu_layers", 0)),
                             (job.get("draft"), job.get("draft_gpu_layers", 0))):
            if not path:
                continue
            m = load_model(path, n_gpu_layers=layers, use_extra_bufts=kernel.repack,
                           use_mmap=kernel.use_mmap)
            models.append(m)
            ctxs.append(m.new_context(n_ctx=job["n_ctx"], n_batch=kernel.n_batch,
                                      n_threads=job.get("n_threads"),
                                      flash_attn=int(kernel.flash_attn),
                                      type_k=kernel.kv_ggml_type, type_v=kernel.kv_ggml_type))
        out["rss_load"] = current_rss()
        g = used_gpu()
        if g is not None:
            out["gpu_load"] = g - base_gpu
        for i, (m, c) in enumerate(zip(models, ctxs)):
            nb = min(kernel.n_batch, c.n_ctx - K_MAX - 2)
            toks = [(1000 + 7919 * j) % m.n_vocab for j in range(nb + K_MAX + 1)]
            c.decode(toks[:nb], 0, logits="last")
            if i == 0:
                c.decode(toks[nb:nb + K_MAX + 1], nb, logits="all")
                c.trim(0, nb)
        out["rss_peak"] = current_rss()
        g = used_gpu()
        if g is not None:
            out["gpu_peak"] = g - base_gpu
        return out
    finally:
        for c in ctxs:
            c.close()
        for m in models:
            m.close()
