"""Release identity: one record naming every component a speculative setup's speed and
output depend on, and one stable hash of it.

    ident = engine.identity            # computed once per engine (collect(engine))
    ident.hash, ident.short            # sha256 of the canonical components; its first 12
    ident.to_dict()                    # {"schema", "hash", "components", "context"}

``components`` is what decides behaviour and speed, and only that is hashed: the model
files (sha256, quantization), their tokenizers (a digest of the vocabulary), the
edgespec code (version, commit, a digest of uncommitted changes), the llama.cpp build
(llama-cpp-python version, llama.cpp's system info, the CMake flags), the kernel
configuration (with the probed exact cap when exact mode uses it), threads and offload,
the controller policy and its settings, the feature matrix (loaded proposers, exact mode)
and the hardware (CPU, ISA, cores, RAM, accelerators). ``context`` says where and when it
was taken (model names and paths, free memory, date) and is not hashed: the same files
loaded by name or by path, today or tomorrow, are the same release.

A part that cannot be determined is recorded as ``None`` (never as an error message
holding a path), so the hash stays a function of the components alone.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import paths, registry
from ..registry import digests
from .._version import __version__
from ..errors import EdgespecError
from ..proposers.vocab_bridge import BRIDGE_VERSION
from ..runtime.llama_build import _cpuinfo
from ..runtime.llama_build import cmake_args as default_args
from ..runtime.device import probe
from ..runtime.gguf_facts import read_facts
from importlib import metadata

SCHEMA = 1
_REPO = Path(__file__).resolve().parents[2]


# --- the record -------------------------------------------------------------------------
def canonical(value: Any) -> Any:
    """JSON-ready, order-free form: dataclasses and mappings become key-sorted dicts,
    tuples and sets lists (sets sorted), paths strings. Anything else is refused, so two
    processes can never serialise one component differently."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(canonical(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise EdgespecError(f"identity components must be finite numbers (got {value})")
        return value
    raise EdgespecError(f"identity components must be plain data (got {type(value).__name__})")


def identity_hash(components: Mapping) -> str:
    blob = json.dumps(canonical(components), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Identity:
    components: Mapping = field(default_factory=dict)  # hashed
    context: Mapping = field(default_factory=dict)  # not hashed

    @property
    def hash(self) -> str:
        return identity_hash(self.components)

    @property
    def short(self) -> str:
        return self.hash[:12]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "hash": self.hash, "components": canonical(self.components),
                "context": canonical(self.context)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Identity":
        return cls(components=d.get("components", {}), context=d.get("context", {}))

    def summary(self) -> str:
        c = self.components
        lines = [f"identity {self.short} (sha256 {self.hash})"]
        for key in sorted(c):
            lines.append(f"  {key}: {json.dumps(canonical(c[key]), sort_keys=True)}")
        return "\n".join(lines)


def diff(a: Identity | Mapping, b: Identity | Mapping) -> list[str]:
    """Dotted paths of the components that differ (what changed between two releases)."""
    ca = canonical(a.components if isinstance(a, Identity) else a.get("components", a))
    cb = canonical(b.components if isinstance(b, Identity) else b.get("components", b))
    out: list[str] = []

    def walk(x, y, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{path}.{k}" if path else k)
        elif x != y:
            out.append(path or "(root)")
    walk(ca, cb, "")
    return out


# --- collection -------------------------------------------------------------------------
def collect(engine) -> Identity:
    """The identity of a loaded engine (the engine caches it: :attr:`Engine.identity`)."""
    target_name = str(getattr(engine, "target_name", "") or "")
    target = model_component(target_name, Path(engine.target.path))
    comps: dict[str, Any] = {
        "target": {**target, "tokenizer": tokenizer_component(engine.target, target["sha256"])},
        "draft": None,
        "edgespec": edgespec_component(),
        "llama_cpp": llama_cpp_component(),
        "kernel": kernel_component(engine),
        "runtime": runtime_component(engine),
        "policy": policy_component(engine),
        "features": features_component(engine),
        "hardware": hardware_component(),
    }
    ctx: dict[str, Any] = {"target": {"name": target_name, "path": str(engine.target.path)},
                           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           "python_executable": sys.executable}
    # the draft model, whichever proposer holds it (the same-vocabulary draft or the bridge)
    holder = next((p for p in engine.proposers.values() if getattr(p, "costly", False)
                   and getattr(p, "model", None) is not None), None)
    draft = getattr(holder, "model", None)
    if draft is not None:
        dname = str(getattr(engine, "draft_name", "") or "")
        dcomp = model_component(dname, Path(draft.path))
        comps["draft"] = {**dcomp, "tokenizer": tokenizer_component(draft, dcomp["sha256"])}
        ctx["draft"] = {"name": dname, "path": str(draft.path)}
        if getattr(holder, "name", "") == "bridge":
            # the bridge is a release artifact: its version is part of what a result rests on
            comps["draft"]["bridge_version"] = BRIDGE_VERSION
    try:
        import psutil
        ctx["ram_available"] = psutil.virtual_memory().available
    except Exception:  # pragma: no cover - psutil is a dependency
        pass
    return Identity(comps, ctx)


def model_component(name: str, path: Path) -> dict:
    """sha256 (the registry's pin when ``name`` is a registry model, which resolve() verified;
    else computed once and cached by registry.digests.model_identity), size and quantization."""
    sha, size, source = None, None, None
    try:
        reg = registry.load_registry()
        if name in reg.models:
            spec = reg.get(name)
            sha, size, source = spec.sha256, spec.size, "registry pin"
    except EdgespecError:
        pass
    if sha is None:
        try:
            ident = digests.model_identity(path)
            sha, size, source = ident["sha256"], int(ident["size"]), "computed"
        except EdgespecError:
            pass
    return {"sha256": sha, "size": size, "digest": source, **quantization(path)}


def quantization(path: Path) -> dict:
    """GGUF file type (e.g. MOSTLY_Q4_K_M) and the bytes by tensor type, from the header."""
    try:
        # deferred: gguf (and its numpy/yaml) only where a header is read
        import gguf

        facts = read_facts(path)
    except (EdgespecError, OSError, ValueError):
        return {"file_type": None, "arch": None, "bytes_by_type": None}
    ft = facts.metadata.get("general.file_type")
    try:
        ft_name = gguf.LlamaFileType(int(ft)).name if ft is not None else None
    except ValueError:
        ft_name = f"file_type {ft}"
    return {"file_type": ft_name, "arch": facts.arch, "bytes_by_type": dict(facts.bytes_by_type)}


def tokenizer_component(model, model_sha256: str | None) -> dict:
    """The vocabulary as the engine sees it: a digest of every token's text and attributes
    (0.2 s for 49k tokens, 0.6 s for Qwen's 152k on this CPU; cached by the model's
    digest), plus the special tokens and the chat template."""
    template = model.chat_template()
    return {
        "n_vocab": int(model.n_vocab),
        "vocab_sha256": digests.vocabulary_digest(model, model_sha256),
        "bos": int(model.bos), "eos": int(model.eos),
        "add_bos": bool(getattr(model, "add_bos", False)),
        "eog": sorted(int(t) for t in model.eog_tokens),
        "chat_template_sha256": (hashlib.sha256(template.encode("utf-8")).hexdigest()
                                 if template else None),
    }


def git_commit(repo: Path = _REPO) -> dict:
    """HEAD of the checkout the package runs from, whether tracked files differ from it, and
    a digest of that difference (so two dirty trees with different edits differ)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None or not (repo / ".git").exists():
        return {"commit": None, "dirty": None, "diff_sha256": None}
    patch = git("diff", "HEAD", "--", "edgespec", "native", "models.toml") or ""
    return {"commit": commit.strip(), "dirty": bool(patch),
            "diff_sha256": hashlib.sha256(patch.encode()).hexdigest() if patch else None}


def edgespec_component() -> dict:
    return {"version": __version__, **git_commit(),
            "python": ".".join(map(str, sys.version_info[:2]))}


def cmake_args() -> dict:
    """The CMake flags llama-cpp-python was built with, as far as this machine can tell:
    $CMAKE_ARGS when set, else what `make install` passes by default
    (edgespec/runtime/llama_build.py); ``wheel_cached`` says whether the Makefile's wheel cache
    holds a wheel keyed by exactly these flags (the Makefile's own key)."""
    version = _dist_version("llama_cpp_python")
    args, source = os.environ.get("CMAKE_ARGS"), "env CMAKE_ARGS"
    if not args:
        args, source = default_args(_cpuinfo()[1]), "edgespec/runtime/llama_build.py"
    if not args:
        return {"args": None, "source": None, "wheel_cached": None}
    key = hashlib.sha256(f"{version} {args} {tuple(sys.version_info[:2])}".encode()).hexdigest()[:16]
    cached = (paths.edgespec_home() / "wheels" / f"llama-cpp-python-{key}").is_dir()
    return {"args": args.split(), "source": source, "wheel_cached": cached}


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except Exception:
        return None


def llama_cpp_component() -> dict:
    """llama-cpp-python's version (which pins the vendored llama.cpp commit), llama.cpp's
    system info (backends and CPU features compiled in) and the CMake flags."""
    info = {"llama_cpp_python": _dist_version("llama_cpp_python"), "system_info": None}
    try:
        from ..runtime.backend import system_info  # deferred: it loads llama.cpp
        info.update(system_info())
    except Exception:  # no llama.cpp here: the identity says so rather than failing
        pass
    info["cmake"] = cmake_args()
    return info


def kernel_component(engine) -> dict:
    """KernelConfig, plus the probed exact cap where exact mode bounds drafts by it."""
    comp = dict(canonical(engine.config.kernel))
    comp["exact_cap"] = engine.exact_max_draft() if getattr(engine, "exact", False) else None
    return comp


def runtime_component(engine) -> dict:
    cfg = engine.config
    return {"threads": int(engine.ctx.n_threads), "n_ctx": int(engine.ctx.n_ctx),
            "n_batch": int(getattr(engine.ctx, "n_batch", cfg.kernel.n_batch)),
            "n_gpu_layers": int(cfg.n_gpu_layers), "draft_gpu_layers": int(cfg.draft_gpu_layers),
            # an RPC split: the servers' hosts, the layers they hold and the shares
            "rpc": getattr(engine.target, "placement", "") or None}


def policy_component(engine) -> dict:
    canary = getattr(engine.guard, "canary", None)
    return {"default_proposer": engine.default_proposer, "exact": bool(engine.exact),
            "control": canonical(engine.control),
            "canary": canonical(canary) if canary is not None else None,
            "proposer_options": canonical(getattr(engine, "proposer_options", {}) or {})}


def features_component(engine) -> dict:
    return {"proposers": {name: {"kind": getattr(p, "name", name), "costly": bool(p.costly)}
                          for name, p in sorted(engine.proposers.items())},
            "exact": bool(engine.exact),
            "chat_template": engine.target.chat_template() is not None}


def hardware_component() -> dict:
    """The probed machine, less what changes by the minute (free memory)."""
    try:
        d = probe()
    except Exception:
        return {"cpu_model": platform.processor() or platform.machine(), "probe": None}
    return {"cpu_model": d.cpu_model, "machine": platform.machine(), "cores": d.cores,
            "logical_cpus": d.logical_cpus, "isa": sorted(d.isa), "ram_total": d.ram_total,
            "accelerators": [{"name": a.name, "kind": a.kind, "total_bytes": a.total_bytes}
                             for a in d.accelerators]}


__all__ = ["Identity", "SCHEMA", "canonical", "collect", "diff", "identity_hash"]
