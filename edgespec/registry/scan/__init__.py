"""GGUF files other tools already keep on disk: find them, name them, check them.

Four stores, each read in the layout its tool writes (the locations are looked up at each
call, so the environment variables apply as set then):

    hfcache   the Hugging Face cache: $HF_HUB_CACHE, else $HF_HOME/hub, else
              $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub; read through
              huggingface_hub.scan_cache_dir. models--OWNER--REPO/snapshots/<commit>/<file>
              is a symlink to blobs/<etag>, and a GGUF file's etag is its sha256 (Git LFS)
    lmstudio  LM Studio's models folders: ~/.lmstudio/models and the older
              ~/.cache/lm-studio/models, PUBLISHER/REPO/FILE.gguf; $EDGESPEC_LMSTUDIO_MODELS
              (one folder, or several joined by os.pathsep) replaces both
    ollama    $OLLAMA_MODELS, else ~/.ollama/models (and, on Linux, the system service's
              /usr/share/ollama/.ollama/models): manifests/HOST/NAMESPACE/MODEL/TAG is JSON
              whose layer of mediaType application/vnd.ollama.image.model names the GGUF
              file, blobs/sha256-<hex>
    llamacpp  llama.cpp's download cache: $LLAMA_CACHE, else ~/.cache/llama.cpp (macOS
              ~/Library/Caches/llama.cpp), files named OWNER_REPO_FILE.gguf; llama.cpp
              builds of 2026 and later write the Hugging Face layout instead (in
              $LLAMA_CACHE when set, else in the Hugging Face cache), read like hfcache

Listing reads headers only (edgespec.runtime.gguf_header, no hashing): a file that is not GGUF,
is truncated or that a manifest names but is missing is listed as unusable with the
reason, and never stops the scan. Where the store names a file by its sha256 (ollama
blobs, Hugging Face LFS blobs), resolving it checks that digest once and records it in
the digest stamps of edgespec.registry.store, so an unchanged file is not hashed again.

The names printed are references (edgespec.registry.refs) that resolve to the file
wherever a model name is accepted.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ...errors import ModelError
from ...runtime.gguf_header import read_gguf_header
from .. import refs
from .listing import _list_store
from .locations import (LMSTUDIO_ENV, OLLAMA_MODEL_LAYER, Store, _Candidate, hf_cache_dir,
                          llamacpp_dir, lmstudio_dirs, ollama_dirs, stores)
from ..spec import load_registry
from ..user import _quant
from ..store import (Progress, Verification, _human, _say, _stamp_path, _write_stamp,
                    sha256_file, stamp_matches)

__all__ = ["LMSTUDIO_ENV", "OLLAMA_MODEL_LAYER", "ScanResult", "ScannedModel", "Store",
           "hf_cache_dir", "llamacpp_dir", "lmstudio_dirs", "ollama_dirs", "resolve_ref", "scan",
           "stores", "verify_ref"]


@dataclass(frozen=True)
class ScannedModel:
    """One model found on disk; ``usable`` False says why in ``problem``."""

    name: str
    source: str
    path: Path
    size: int
    usable: bool
    problem: str | None = None
    architecture: str | None = None
    quant: str | None = None
    vocab_size: int | None = None
    context_length: int | None = None
    description: str | None = None
    sha256: str | None = None       # the digest the store names it by
    verified: bool | None = None    # that digest checked since the file last changed
    parts: int = 1

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "path": str(self.path),
                "size": self.size, "usable": self.usable, "problem": self.problem,
                "architecture": self.architecture, "quant": self.quant,
                "vocab_size": self.vocab_size, "context_length": self.context_length,
                "description": self.description, "sha256": self.sha256,
                "verified": self.verified, "parts": self.parts}


@dataclass(frozen=True)
class ScanResult:
    stores: tuple[Store, ...]
    models: tuple[ScannedModel, ...] = field(default=())

    def to_json(self) -> dict:
        return {"stores": [{"source": s.source, "root": str(s.root), "env": s.env,
                            "present": s.present, "notes": list(s.notes)} for s in self.stores],
                "models": [m.to_json() for m in self.models]}


# --------------------------------------------------------------------------- scan


def scan(sources: Iterable[str] | None = None) -> ScanResult:
    """Every GGUF file in the stores of `sources` (default all), with the facts its header
    gives; nothing is hashed. A store that does not exist is reported absent."""
    found_stores, models = [], []
    seen: dict[str, Path] = {}
    for store in stores(sources):
        store, candidates = _list_store(store)
        found_stores.append(store)
        for c in candidates:
            model = _facts(c)
            if c.name in seen:  # a second folder of the same tool: the name means the first
                model = _unusable(model, f"the name {c.name} resolves to {seen[c.name]} in an "
                                         f"earlier folder; set {store.env} to this folder to "
                                         "use this file")
            seen.setdefault(c.name, c.path)
            models.append(model)
    return ScanResult(tuple(found_stores), tuple(models))


def _unusable(m: ScannedModel, problem: str) -> ScannedModel:
    return dataclasses.replace(m, usable=False, problem=problem)


def _facts(c: _Candidate) -> ScannedModel:
    base = dict(name=c.name, source=c.source, path=c.path, size=c.size, sha256=c.sha256,
                parts=c.parts)
    if c.problem:
        return ScannedModel(usable=False, problem=c.problem, **base)
    try:
        info = read_gguf_header(c.path, fix=c.hint)
    except ModelError as e:
        return ScannedModel(usable=False, problem=str(e), **base)
    meta = info.metadata
    desc = meta.get("general.name")
    return ScannedModel(
        usable=True, architecture=info.architecture, quant=_quant(meta.get("general.file_type"))
        or None, vocab_size=info.vocab_size, context_length=info.context_length,
        description=desc if isinstance(desc, str) else None,
        verified=stamp_matches(c.path, c.sha256) if c.sha256 else None, **base)


# --------------------------------------------------------------------------- resolve


def resolve_ref(name: str, progress: Progress | None = None) -> Path:
    """The checked GGUF file a store reference names (see edgespec.registry.refs).

    Raises ModelError for an unknown model (listing the ones present), a store that does
    not exist, a file that is missing, not GGUF or truncated, and a file whose sha256 does
    not match the digest its store names it by. That digest is hashed once and stamped."""
    say = progress or _say
    c = _checked(name)
    if c.sha256 and not stamp_matches(c.path, c.sha256):
        say(f"checking the sha256 of {name} ({_human(c.size)}) against its name, once")
        actual = sha256_file(c.path)
        if actual != c.sha256:
            raise ModelError(f"{name}: {c.path} has sha256 {actual}, but its store names it "
                             f"by sha256 {c.sha256}: the file is corrupt or was changed; "
                             f"{c.hint}")
        _write_stamp(c.path, actual)
    return c.path


def _checked(name: str):
    """The store's entry for reference ``name``, its GGUF header checked (ModelError naming
    the reference otherwise)."""
    c = _find(refs.parse(name))
    if c.problem:
        raise ModelError(f"{name}: {c.problem}")
    try:
        read_gguf_header(c.path, fix=c.hint)
    except ModelError as e:
        raise ModelError(f"{name}: {e}") from None
    return c


def _drop_stamp(path: Path) -> None:
    try:
        _stamp_path(path).unlink(missing_ok=True)
    except OSError:  # a read-only cache: nothing was recorded there either
        pass


def verify_ref(name: str, progress: Progress | None = None) -> Verification:
    """Re-hash the file a store reference names (always, unlike resolve_ref) and compare
    it with the digest its store names it by; a mismatch is returned (ok=False) and its
    stamp dropped. A file the store names by no digest is ok when its header checks out."""
    say = progress or _say
    c = _checked(name)
    say(f"hashing {name} ({_human(c.size)})")
    sha = sha256_file(c.path)
    match = next((m.name for m in load_registry().models.values() if m.sha256 == sha), None)
    if c.sha256 is None:
        return Verification(path=c.path, ok=True, actual_sha256=sha, actual_size=c.size,
                            name=match, message="a valid GGUF header; its store names no "
                            "digest (pin one with `edgespec models add NAME REF`)")
    ok = sha == c.sha256
    if ok:
        _write_stamp(c.path, sha)
    else:
        _drop_stamp(c.path)
    return Verification(path=c.path, ok=ok, actual_sha256=sha, actual_size=c.size, name=match,
                        expected_sha256=c.sha256, expected_size=c.size,
                        message="ok" if ok else f"{c.path} has sha256 {sha}, but its store "
                        f"names it by sha256 {c.sha256}: the file is corrupt or was changed; "
                        f"{c.hint}")


def _find(ref: refs.StoreRef) -> _Candidate:
    where = stores([ref.scheme])
    candidates: list[_Candidate] = []
    listed = []
    for store in where:
        store, found = _list_store(store)
        listed.append(store)
        candidates += found
    if ref.scheme == "ollama":
        want = refs.parse_ollama(ref.locator).canonical.lower()
        hits = [c for c in candidates if c.ollama.lower() == want]
    elif ref.scheme in ("hfcache", "llamacpp"):
        hits = _match_hf_layout(ref, candidates)
    else:
        hits = [c for c in candidates if c.name == str(ref)]
    if hits:
        return hits[0]
    roots = ", ".join(str(s.root) for s in listed)
    if not any(s.present for s in listed):
        raise ModelError(f"{ref}: there is no {ref.scheme} store here ({roots} "
                         f"{'does' if len(listed) == 1 else 'do'} not exist); set "
                         f"{listed[0].env} to where it keeps its models")
    names = list(dict.fromkeys(c.name for c in candidates))
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    get = {"ollama": f"`ollama pull {ref.locator}`",
           "hfcache": "`hf download OWNER/REPO FILE.gguf`",
           "lmstudio": "LM Studio", "llamacpp": "`llama-cli -hf OWNER/REPO`"}[ref.scheme]
    notes = "".join(f" ({s.root}: {n})" for s in listed for n in s.notes)
    raise ModelError(f"no {ref.scheme} model {ref} in {roots}; "
                     + (f"present: {shown}" if names else "it holds no GGUF models")
                     + f"{notes}. Get it with {get}, or see `edgespec models scan`")


def _match_hf_layout(ref: refs.StoreRef, candidates: list[_Candidate]) -> list[_Candidate]:
    """NAME or NAME@REV (a ref such as main, or a commit prefix of at least 7 digits)."""
    base, _, rev = ref.locator.partition("@")
    plain = f"{ref.scheme}:{base}"
    if not rev:
        return [c for c in candidates if c.name == plain]
    out = []
    for c in candidates:
        if c.name.split("@", 1)[0] == plain and (
                rev in c.ref_names or (len(rev) >= 7 and c.commit.startswith(rev))):
            out.append(c)
    return out
