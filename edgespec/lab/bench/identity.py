"""Run identity: the engine's release identity plus what a benchmark run adds (anchors,
load, date, command)."""
from __future__ import annotations

import dataclasses

import datetime as _dt
import os
import platform
import sys
from pathlib import Path

from .matrix import Matrix
from .tools import ToolAnchor
import psutil


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:

    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "cpu_model": cpu_model(),
        "cpus_logical": psutil.cpu_count(logical=True),
        "cpus_physical": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        # a busy machine makes timings noise: keep the load the run started under
        "load_average": load,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def anchor_identity(a) -> dict:
    if isinstance(a, ToolAnchor):
        st = a.setup
        stamp = st.bin_dir / "BUILD.json"
        return {"implementation": f"llama.cpp {a.tool} ({st.bin_dir})", "n_ctx": st.n_ctx,
                "threads": st.threads, "flash_attn": st.flash_attn, "kv_type": st.kv_type,
                "repack": st.repack, "draft_max": a.draft_max,
                "build": stamp.read_text() if stamp.is_file() else None}
    return {"n_ctx": a.n_ctx, "num_pred_tokens": a.num_pred_tokens,
            "weights": ("the engine's loaded model" if getattr(a, "shared_weights", False)
                        else "its own copy"),
            "implementation": "llama_cpp.Llama + LlamaPromptLookupDecoding (library defaults: "
                              "flash attention off, repacked weights on)"}


def collect_identity(m: Matrix, engine, anchors: dict, engine_knobs: dict | None = None) -> dict:
    """The run's identity: the engine's release identity (edgespec.identity, the one record
    every output carries) under ``release``, its hash, and what is particular to a run (the
    anchors, the machine's load, the date, the command line). The other keys are views of
    the release record that the report and `edgespec qualify` read."""
    release = engine.identity
    comps, ctx = release.components, release.context
    models = {}
    for role in ("target", "draft"):
        if comps.get(role) and role in ctx:
            c = comps[role]
            models[role] = {"name": ctx[role]["name"], "path": ctx[role]["path"], "size": c["size"],
                            "sha256": c["sha256"], "digest": c["digest"],
                            "file_type": c.get("file_type")}
    es = comps["edgespec"]
    return {
        "release_hash": release.hash,
        "release": release.to_dict(),
        "edgespec": {"version": es["version"], "commit": es["commit"], "dirty": es["dirty"]},
        "llama_cpp": {k: v for k, v in comps["llama_cpp"].items() if k != "cmake"},
        "models": models,
        "engine": {
            "n_ctx": engine.ctx.n_ctx,
            "threads": engine.ctx.n_threads,
            "control": dataclasses.asdict(engine.control),
            "use_extra_bufts": getattr(engine.target, "use_extra_bufts", None),
            "proposers": sorted(engine.proposers),
            "default_proposer": getattr(engine, "default_proposer", None),
            "exact": getattr(engine, "exact", None),
            # per-configuration controller knobs; anything absent is the engine's default
            "control_knobs": dict(engine_knobs or {}),
        },
        "anchors": {label: anchor_identity(a) for label, a in anchors.items()},
        "machine": machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
    }
