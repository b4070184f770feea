"""The served models as Ollama lists them: ``/api/tags`` (every model), ``/api/ps`` (the
loaded ones), ``/api/show`` (one model's details, template and capabilities).

Everything comes from the GGUF file's header (no weights read, nothing loaded): family
(the architecture), parameter count, quantization, context length, the chat template;
the digest is the file's sha256 (the registry's pin, else computed once and cached by
edgespec.identity). Capabilities are what clients such as Zed and VS Code check before
offering a model: ``completion`` always, ``tools`` where the chat template renders tool
declarations, ``insert`` where the model has fill-in-the-middle tokens, ``thinking`` where
the template opens a ``<think>`` block.
"""
from __future__ import annotations

import math
import os
import time
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import EdgespecError
from ...protocol.fim import has_fim
from ...serving import ModelPool, PoolModel

#: metadata whose size makes no sense in a listing (the template has its own field)
_SKIP_INFO = frozenset({"tokenizer.chat_template"})
#: what /api/ps says of a model kept until memory is needed (Ollama's "forever")
_FOREVER = datetime(2318, 1, 1, tzinfo=timezone.utc)


def tag(name: str) -> str:
    """An Ollama model name: ``name:tag``, ``latest`` when the id has no tag."""
    return name if ":" in name else f"{name}:latest"


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def model_path(entry: PoolModel) -> Path | None:
    """The GGUF file of a pool entry: the loaded engine's, else its configured target
    resolved without pulling (None when it is not on this machine)."""
    engine = entry.engine
    target = getattr(engine, "target", None) if engine is not None else None
    if target is not None and getattr(target, "path", None) is not None:
        return Path(target.path)
    ref = getattr(entry.config, "target", None) if entry.config is not None else None
    if ref is None:
        return None
    from ...registry.pull import resolve  # deferred: the registry reads models.toml
    try:
        return resolve(ref, pull=False)
    except (EdgespecError, OSError):
        return None


@lru_cache(maxsize=32)
def _file_facts(path: str, mtime_ns: int, size: int, name: str) -> dict[str, Any]:
    """What the listings say of one file (cached by path, mtime and size)."""
    from ...identity.identity import model_component  # deferred: hashing on first use
    from ...runtime.gguf_facts import read_facts  # deferred: reads the gguf package

    facts = read_facts(path)
    meta = facts.metadata
    component = model_component(name, Path(path))
    params = meta.get("general.parameter_count")
    if not isinstance(params, int) or isinstance(params, bool):
        params = sum(math.prod(t.shape) for t in facts.tensors) if facts.tensors else 0
    ftype = component.get("file_type") or ""
    quant = ftype.removeprefix("MOSTLY_").removeprefix("ALL_") if ftype else "unknown"
    template = meta.get("tokenizer.chat_template")
    template = template if isinstance(template, str) else ""
    details = {"parent_model": "", "format": "gguf", "family": facts.arch,
               "families": [facts.arch], "parameter_size": _size(params),
               "quantization_level": quant}
    info = {k: v for k, v in sorted(meta.items())
            if k not in _SKIP_INFO and (k.startswith(("general.", "tokenizer.ggml."))
                                        or k.startswith(facts.arch + "."))}
    info["general.parameter_count"] = params
    fim = any(f"tokenizer.ggml.fim_{r}_token_id" in meta for r in ("pre", "suf", "mid"))
    return {"size": size, "digest": component.get("sha256") or "",
            "modified_at": _rfc3339(datetime.fromtimestamp(mtime_ns / 1e9, timezone.utc)),
            "details": details, "model_info": info, "template": template,
            "context_length": facts.n_ctx_train, "embedding_length": facts.n_embd,
            "fim_in_header": fim, "license": meta.get("general.license")}


def _size(n: int) -> str:
    """Ollama's parameter size: "135.0M", "1.5B"."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.1f}M"


def facts(entry: PoolModel) -> dict[str, Any] | None:
    path = model_path(entry)
    if path is None:
        return None
    try:
        st = os.stat(path)
        name = str(getattr(entry.config, "target", None) or entry.name)
        return _file_facts(str(path), st.st_mtime_ns, st.st_size, name)
    except (EdgespecError, OSError, ValueError):
        return None


def card(entry: PoolModel) -> dict[str, Any]:
    """One model as /api/tags lists it."""
    f = facts(entry) or {}
    return {"name": tag(entry.name), "model": tag(entry.name),
            "modified_at": f.get("modified_at", _rfc3339(datetime.now(timezone.utc))),
            "size": f.get("size", 0), "digest": f.get("digest", ""),
            "details": f.get("details", {"parent_model": "", "format": "gguf", "family": "",
                                         "families": [], "parameter_size": "",
                                         "quantization_level": ""})}


def tags(pool: ModelPool) -> list[dict[str, Any]]:
    return [card(m) for m in pool.entries()]


def running(pool: ModelPool) -> list[dict[str, Any]]:
    """The loaded models as /api/ps lists them (CPU memory: ``size_vram`` 0)."""
    out = []
    now_wall, now = datetime.now(timezone.utc), time.monotonic()
    for m in pool.entries():
        engine = m.engine
        if engine is None:
            continue
        c = card(m)
        keep = getattr(m, "keep_alive", None)
        keep = pool.keep_alive if keep is None else keep
        expires = _FOREVER if keep is None or keep < 0 else \
            now_wall + timedelta(seconds=max(m.last_used + keep - now, 0.0))
        cfg = getattr(engine, "config", None)
        out.append({"name": c["name"], "model": c["model"],
                    "size": m.memory or c["size"], "digest": c["digest"],
                    "details": c["details"], "expires_at": _rfc3339(expires),
                    "size_vram": 0, "context_length": getattr(cfg, "n_ctx", 0) or 0})
    return out


def show(entry: PoolModel) -> dict[str, Any]:
    """One model as /api/show describes it; ``template`` is the GGUF's Jinja chat template
    (Ollama's own models carry a Go template there)."""
    f = facts(entry)
    if f is None:
        raise EdgespecError(f"the model {entry.name!r} is not on this machine yet; it is "
                            "pulled when it is first loaded")
    template = f["template"]
    engine = entry.engine
    if engine is not None:
        live = engine.target.chat_template()
        template = live if live is not None else template
    caps = ["completion"]
    if template:
        from ...agents import supports_tools  # deferred: renders the template once
        if supports_tools(template):
            caps.append("tools")
    if _fim(entry, f):
        caps.append("insert")
    if "<think>" in template or "enable_thinking" in template:
        caps.append("thinking")
    details = dict(f["details"], context_length=f["context_length"],
                   embedding_length=f["embedding_length"])
    body = {"modelfile": f"# served by edgespec\nFROM {model_path(entry)}\n",
            "parameters": "", "template": template, "details": details,
            "model_info": f["model_info"], "capabilities": caps,
            "modified_at": f["modified_at"]}
    if isinstance(f.get("license"), str):
        body["license"] = f["license"]
    return body


def _fim(entry: PoolModel, f: dict[str, Any]) -> bool:
    """FIM tokens: the loaded vocabulary's (as llama.cpp finds them), else the header's."""
    engine = entry.engine
    if engine is not None:
        return has_fim(engine.target)
    return bool(f["fim_in_header"])
