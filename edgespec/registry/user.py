"""The user registry: your own models, layered over the registry shipped with the package.

``$EDGESPEC_HOME/models.toml`` (edgespec.paths.user_registry_path) has the shipped file's
format; its models pin a local file with ``path`` (written by ``edgespec models add``) or a
``source`` like shipped ones, and its ``[[pairs]]`` may name models of either registry. A
name may be defined in one registry only: a model that silently replaced a shipped one
would change what ``--target NAME`` means without a word.

The file is rewritten whole (edgespec.statefile: temp file, fsync, rename, under a lock), and only after the new
contents validated, so a failed add or remove leaves it as it was.
"""
from __future__ import annotations

from pathlib import Path

from .. import statefile
from ..errors import ModelError
from ..runtime.gguf_header import GGUFInfo
from ..paths import user_registry_path
from .spec import (ROLES, SCHEMA, Derivation, ModelSpec, Registry, check_name, layer, layer_dict,
                   read_user, registry_path)
from .store import (Progress, _atomic_write_text, _human, _model_lock, _say, _stamp_path,
                    _write_stamp, check_gguf, sha256_file)
from .toml_write import dumps

_HEADER = """Your own models for edgespec, layered over the registry that ships with it.
Written by `edgespec models add` / `edgespec models remove` (comments are not kept);
the format is that of the shipped models.toml, with `path` instead of `source`."""

# GGUF tokenizer.ggml.model -> the family word the shipped registry uses in tokenizer ids
_TOKENIZER_KIND = {"gpt2": "bpe", "llama": "spm"}


def facts_entry(info: GGUFInfo, path: Path, size: int, sha256: str, role: str,
                tokenizer: str | None = None) -> dict:
    """The registry entry of a checked GGUF file: its pin (path, size, sha256) and the facts
    pairing and listing need, read from the header."""
    context = info.context_length
    if not context or context <= 0:
        raise ModelError(f"{path}: the header has no {info.architecture}.context_length; "
                         "llama.cpp cannot load this file as a model")
    meta = info.metadata
    if tokenizer is None:
        kind = meta.get("tokenizer.ggml.model")
        kind = _TOKENIZER_KIND.get(kind, kind) if isinstance(kind, str) else "unknown"
        tokenizer = f"{info.architecture or 'unknown'}-{kind}-{info.vocab_size or 0}"
    entry = {"description": str(meta.get("general.name") or path.stem), "role": role,
             "path": str(path), "size": size, "sha256": sha256, "tokenizer": tokenizer,
             "chat_template": info.has_chat_template, "context": context}
    quant = _quant(meta.get("general.file_type"))
    if quant:
        entry["quant"] = quant
    return entry


def _quant(file_type) -> str:
    if not isinstance(file_type, int):
        return ""
    # deferred: gguf only where a model is added
    import gguf
    try:
        return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        return ""


def add(name: str, file: str | Path, role: str = "target", tokenizer: str | None = None,
        progress: Progress | None = None, hub: str | None = None, *,
        derived: Derivation | None = None, sha256: str | None = None,
        description: str | None = None, replace: bool = False) -> ModelSpec:
    """Pin the local GGUF `file` as model `name` in the user registry; returns its spec.

    `hub`: the hf://owner/repo@commit/file the file was pulled from (edgespec.registry.hub),
    recorded so a file the Hugging Face cache lost is fetched again. `derived`: what the
    file was made from (edgespec.registry.optimize, which passes the `sha256` it just
    computed, and `replace` to remake a copy it made before: only such an entry is replaced).

    Refused (ModelError, the file untouched) for a bad or taken name, a user registry that
    does not validate, and a file that is missing, not GGUF or truncated."""
    say = progress or _say
    bad = check_name(name)
    if bad:
        raise ModelError(f"{name!r}: {bad}; choose another name")
    if role not in ROLES:
        raise ModelError(f"role {role!r} is not one of {', '.join(ROLES)}")
    shipped = Registry.load(registry_path())
    if name in shipped.models:
        raise ModelError(f"{name!r} is a shipped model; choose another name for your file")
    path = user_registry_path()
    layer(shipped, path)  # a broken user registry is reported before a long hash, too
    file = Path(file).expanduser().absolute()
    info = check_gguf(file)  # missing, not GGUF, truncated: each says what is wrong
    size = file.stat().st_size
    if sha256 is None:
        say(f"hashing {file} ({_human(size)})")
    sha = sha256 or sha256_file(file)
    entry = facts_entry(info, file, size, sha, role, tokenizer)
    if description:
        entry["description"] = description
    if hub:
        entry["hub"] = hub
    if derived is not None:
        entry["derived"] = {"from": derived.source, "sha256": derived.sha256,
                            "change": derived.change}
    with _model_lock("user-registry", say):
        doc = read_user(path) or {"schema": SCHEMA}
        layer_dict(shipped, doc, path)  # an invalid file is reported, never overwritten
        models = doc.setdefault("models", {})
        old = models.get(name)
        if old is not None and not (replace and isinstance(old, dict) and "derived" in old):
            raise ModelError(f"{name!r} is already in {path}; `edgespec models remove {name}` "
                             "first to replace it")
        models[name] = entry
        reg = layer_dict(shipped, doc, path)
        _write(path, doc)
    _write_stamp(file, sha)  # just hashed: the first resolve need not hash it again
    return reg.get(name)


def _write(path: Path, doc: dict) -> None:
    """The user registry, whole or not at all (edgespec.statefile); called under its lock,
    which also makes this the moment to remove what killed writers left beside it."""
    statefile.clean_temps(path.parent)
    _atomic_write_text(path, dumps(doc, header=_HEADER), what="user registry")


def remove(name: str) -> tuple[dict, list[dict]]:
    """Drop model `name` (and the user pairs that name it) from the user registry; returns
    (its entry, the pairs dropped). The model file itself stays where it is.

    Only that entry changes, and the rest is not validated first, so this also repairs a
    name that clashes with a shipped model."""
    path = user_registry_path()
    with _model_lock("user-registry", _say):
        doc = read_user(path) or {}
        models = doc.get("models", {})
        if not isinstance(models, dict) or name not in models:
            if name in Registry.load(registry_path()).models:
                raise ModelError(f"{name!r} is a shipped model; only models added with "
                                 "`edgespec models add` can be removed")
            known = ", ".join(models) if isinstance(models, dict) and models else "none"
            raise ModelError(f"no model {name!r} in the user registry {path} (its models: "
                             f"{known})")
        entry = models.pop(name)
        pairs = doc.get("pairs", [])
        kept = [p for p in pairs if not (isinstance(p, dict)
                                         and name in (p.get("target"), p.get("draft")))]
        dropped = [p for p in pairs if p not in kept]
        if "pairs" in doc:
            doc["pairs"] = kept
        _write(path, doc)
    if isinstance(entry, dict) and isinstance(entry.get("path"), str):
        _stamp_path(Path(entry["path"])).unlink(missing_ok=True)
    return entry, dropped


def add_pair(target: str, proposer: str, draft: str | None = None, **pins: str) -> bool:
    """Register the pair ``target`` + ``proposer`` (+ ``draft``) in the user registry, so
    listings, exports and ``--proposer auto`` find it; both must be registry names. ``pins``:
    a bridge pair's bridge_version and vocabulary digests. False when already registered.
    ModelError (the file untouched) when the pair does not validate (a draft of another
    tokenizer, an unknown name)."""
    path = user_registry_path()
    shipped = Registry.load(registry_path())
    with _model_lock("user-registry", _say):
        doc = read_user(path) or {"schema": SCHEMA}
        reg = layer_dict(shipped, doc, path)
        if any((p.target, p.proposer, p.draft) == (target, proposer, draft) for p in reg.pairs):
            return False
        entry = {"target": target, "proposer": proposer, **({"draft": draft} if draft else {}),
                 **pins}
        doc.setdefault("pairs", []).append(entry)
        layer_dict(shipped, doc, path)
        _write(path, doc)
    return True


def drop_pair(target: str, proposer: str, draft: str | None = None) -> bool:
    """Remove that pair from the user registry; whether it was there."""
    path = user_registry_path()
    with _model_lock("user-registry", _say):
        doc = read_user(path)
        pairs = doc.get("pairs") if doc else None
        if not isinstance(pairs, list):
            return False
        kept = [p for p in pairs if not (isinstance(p, dict) and (
            p.get("target"), p.get("proposer"), p.get("draft")) == (target, proposer, draft))]
        if len(kept) == len(pairs):
            return False
        doc["pairs"] = kept
        _write(path, doc)
    return True
