"""Run identity: everything needed to say what a benchmark number was measured on."""
from __future__ import annotations

import dataclasses

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path

from .matrix import Matrix

_REPO = Path(__file__).resolve().parents[2]


def git_commit(repo: Path = _REPO) -> dict:
    """HEAD of the checkout the package runs from, and whether tracked files differ from it."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    import psutil

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


def model_identity(name: str, path: Path) -> dict:
    """Registry models carry their pinned digest (resolve() verified the file against it);
    a local path is hashed here."""
    from .. import registry

    info = {"name": name, "path": str(path), "size": path.stat().st_size}
    reg = registry.load_registry()
    if name in reg.models:
        info.update(sha256=reg.get(name).sha256, digest="registry-verified")
    else:
        info.update(sha256=registry.sha256_file(path), digest="computed")
    return info


def anchor_identity(a) -> dict:
    from .tools import ToolAnchor

    if isinstance(a, ToolAnchor):
        st = a.setup
        stamp = st.bin_dir / "BUILD.json"
        return {"implementation": f"llama.cpp {a.tool} ({st.bin_dir})", "n_ctx": st.n_ctx,
                "threads": st.threads, "flash_attn": st.flash_attn, "kv_type": st.kv_type,
                "repack": st.repack, "draft_max": a.draft_max,
                "build": stamp.read_text() if stamp.is_file() else None}
    return {"n_ctx": a.n_ctx, "num_pred_tokens": a.num_pred_tokens,
            "implementation": "llama_cpp.Llama + LlamaPromptLookupDecoding (library defaults: "
                              "flash attention off, repacked weights on)"}


def collect_identity(m: Matrix, engine, anchors: dict, engine_knobs: dict | None = None) -> dict:
    from .. import __version__, backend

    models = {"target": model_identity(m.target, Path(engine.target.path))}
    draft = engine.proposers.get("draft")
    if draft is not None and m.draft is not None:
        models["draft"] = model_identity(m.draft, Path(draft.model.path))
    return {
        "edgespec": {"version": __version__, **git_commit()},
        "llama_cpp": backend.system_info(),
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
