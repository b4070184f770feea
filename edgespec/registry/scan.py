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
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..errors import ModelError
from ..runtime.gguf_header import read_gguf_header
from . import refs
from .spec import load_registry
from .user import _quant
from .store import (Progress, Verification, _human, _say, _stamp_path, _write_stamp,
                    sha256_file, stamp_matches)

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
LMSTUDIO_ENV = "EDGESPEC_LMSTUDIO_MODELS"

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# llama.cpp's split naming (gguf-split): <prefix>-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")

# What to do about a broken file, per store: the tool that wrote it can write it again.
_REFETCH = {
    "hfcache": "re-download it (`hf download {repo} {file}`) or delete that snapshot",
    "lmstudio": "re-download it in LM Studio, or delete the file",
    "ollama": "re-pull it with `ollama pull {ollama}`",
    "llamacpp": "delete it and let llama.cpp download it again",
}


@dataclass(frozen=True)
class Store:
    """One place a tool keeps models, and whether it exists on this machine."""

    source: str      # a refs.SCHEMES scheme
    root: Path
    env: str         # the variable that moves it
    present: bool
    notes: tuple[str, ...] = ()  # what the store's own scan reported (a corrupt repo folder)


@dataclass(frozen=True)
class _Candidate:
    """A file a store lists, before its header is read."""

    name: str                  # the reference that resolves to it
    source: str
    path: Path                 # what llama.cpp loads (a split set: its first part)
    size: int                  # bytes on disk (a split set: all parts)
    sha256: str | None = None  # the digest the store names the file by, if it does
    problem: str | None = None
    hint: str = ""             # what to do when the file is broken
    ollama: str = ""           # ollama: the canonical name a reference is compared with
    commit: str = ""           # Hugging Face layout: the snapshot's commit and the refs
    ref_names: tuple[str, ...] = ()  # (branches, tags) pointing to it
    parts: int = 1


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


# --------------------------------------------------------------------------- locations


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def hf_cache_dir() -> Path:
    """huggingface_hub's cache, from the environment as it is now (huggingface_hub itself
    reads it once, at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if (p := _env_path(var)) is not None:
            return p
    if (home := _env_path("HF_HOME")) is not None:
        return home / "hub"
    xdg = _env_path("XDG_CACHE_HOME") or Path.home() / ".cache"
    return xdg / "huggingface" / "hub"


def lmstudio_dirs() -> list[Path]:
    value = os.environ.get(LMSTUDIO_ENV)
    if value:
        return [Path(p).expanduser() for p in value.split(os.pathsep) if p]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def ollama_dirs() -> list[Path]:
    if (p := _env_path("OLLAMA_MODELS")) is not None:
        return [p]
    dirs = [Path.home() / ".ollama" / "models"]
    if sys.platform.startswith("linux"):  # the install script's systemd service runs as ollama
        dirs.append(Path("/usr/share/ollama/.ollama/models"))
    return dirs


def llamacpp_dir() -> Path:
    """llama.cpp's fs_get_cache_directory()."""
    if (p := _env_path("LLAMA_CACHE")) is not None:
        return p
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "llama.cpp"
    return (_env_path("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def stores(sources: Iterable[str] | None = None) -> tuple[Store, ...]:
    """Every store location of `sources` (default all), present or not."""
    wanted = tuple(sources) if sources else refs.SCHEMES
    out = []
    for source in wanted:
        if source == "hfcache":
            env, roots = "HF_HUB_CACHE", [hf_cache_dir()]
        elif source == "lmstudio":
            env, roots = LMSTUDIO_ENV, lmstudio_dirs()
        elif source == "ollama":
            env, roots = "OLLAMA_MODELS", ollama_dirs()
        elif source == "llamacpp":
            env, roots = "LLAMA_CACHE", [llamacpp_dir()]
        else:
            raise ModelError(f"unknown model store {source!r}; the stores are "
                             + ", ".join(refs.SCHEMES))
        out += [Store(source, r, env, r.is_dir()) for r in roots]
    return tuple(out)


# --------------------------------------------------------------------------- listing


def _list_store(store: Store) -> tuple[Store, list[_Candidate]]:
    if not store.present:
        return store, []
    try:
        return _list_present(store)
    except OSError as e:  # another user's store (the ollama service's), a dying disk
        note = f"cannot read it ({e.strerror or e}{f': {e.filename}' if e.filename else ''})"
        return dataclasses.replace(store, notes=store.notes + (note,)), []


def _list_present(store: Store) -> tuple[Store, list[_Candidate]]:
    if store.source == "hfcache":
        return _list_hf_layout(store)
    if store.source == "ollama":
        return store, _list_ollama(store.root)
    files = _list_files(store.source, store.root)
    if store.source == "llamacpp" and any(store.root.glob("models--*")):
        # llama.cpp since 2026 keeps -hf downloads in the Hugging Face layout (in $LLAMA_CACHE
        # when set, else in the Hugging Face cache itself) and migrates its flat files there
        store, hf = _list_hf_layout(store)
        files += hf
    return store, files


def _gguf_files(root: Path) -> list[Path]:
    """Every *.gguf under root, sorted, skipping hidden folders (partial downloads, trash)
    and Hugging Face layout repos (models--OWNER--REPO), which _list_hf_layout reads."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and not (Path(dirpath) == root and d.startswith("models--")))
        found += [Path(dirpath) / f for f in sorted(filenames)
                  if f.lower().endswith(".gguf") and not f.startswith(".")]
    return found


def _group_splits(files: list[tuple[str, Path]]) -> list[tuple[str, Path, int, str | None, int]]:
    """(name, path) pairs -> (name, first path, total size, problem, parts), a split set
    (name-00001-of-0000N.gguf) listed once under its first part, as llama.cpp loads it."""
    sets: dict[tuple[str, str, int], dict[int, tuple[str, Path]]] = {}
    out = []
    for name, path in files:
        m = _SPLIT.match(path.name)
        if m is None:
            out.append((name, path, _size(path), None, 1))
            continue
        key = (str(path.parent), m["prefix"], int(m["count"]))
        sets.setdefault(key, {})[int(m["index"])] = (name, path)
    for (parent, prefix, count), parts in sets.items():
        first = parts.get(1)
        missing = [i for i in range(1, count + 1) if i not in parts]
        if first is None:  # listed under the part llama.cpp would need first
            name, path = parts[min(parts)]
            name = name.replace(path.name, f"{prefix}-00001-of-{count:05d}.gguf")
            path = path.with_name(f"{prefix}-00001-of-{count:05d}.gguf")
        else:
            name, path = first
        size = sum(_size(p) for _, p in parts.values())
        problem = None
        if missing:
            problem = (f"split set {prefix}-*-of-{count:05d}.gguf in {parent} lacks part"
                       f"{'s' if len(missing) > 1 else ''} "
                       + ", ".join(f"{i:05d}" for i in missing))
        out.append((name, path, size, problem, count))
    return sorted(out, key=lambda t: t[0])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _list_files(source: str, root: Path) -> list[_Candidate]:
    files = [(f"{source}:{p.relative_to(root).as_posix()}", p) for p in _gguf_files(root)]
    return [_Candidate(name, source, path, size, problem=problem, parts=parts,
                       hint=_REFETCH[source])
            for name, path, size, problem, parts in _group_splits(files)]


def _list_hf_layout(store: Store) -> tuple[Store, list[_Candidate]]:
    """The GGUF files of a Hugging Face layout cache, named <source>:OWNER/REPO/FILE."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound
    try:
        info = scan_cache_dir(store.root)
    except CacheNotFound:
        return Store(store.source, store.root, store.env, False), []
    # llama.cpp's cache also holds its flat files, which are not repos
    notes = tuple(str(w) for w in info.warnings
                  if store.source == "hfcache" or "models--" in str(w))
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        # the revision `main` points to names the file plainly; the others with @commit
        revisions = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified),
                           reverse=True)
        plain: set[str] = set()
        for rev in revisions:
            files = [(f.file_path.relative_to(rev.snapshot_path).as_posix(), f)
                     for f in rev.files if f.file_name.lower().endswith(".gguf")]
            by_path = {f.file_path: f for _, f in files}
            grouped = _group_splits([(rel, f.file_path) for rel, f in files])
            for rel, path, size, problem, parts in grouped:
                name = f"{store.source}:{repo.repo_id}/{rel}"
                if rel in plain:
                    name += f"@{rev.commit_hash[:12]}"
                plain.add(rel)
                cached = by_path.get(path)
                out.append(_Candidate(
                    name, store.source, path, size,
                    sha256=_lfs_sha(cached) if parts == 1 else None, problem=problem,
                    parts=parts, hint=_REFETCH[store.source].format(repo=repo.repo_id, file=rel),
                    commit=rev.commit_hash, ref_names=tuple(sorted(rev.refs))))
    return Store(store.source, store.root, store.env, True, notes), out


def _lfs_sha(cached) -> str | None:
    """A Hub LFS file's etag, which names its blob, is the file's sha256."""
    if cached is None:
        return None
    blob = Path(cached.blob_path)
    return blob.name if blob.parent.name == "blobs" and _SHA256_HEX.match(blob.name) else None


def _list_ollama(root: Path) -> list[_Candidate]:
    manifests = root / "manifests"
    out = []
    if not manifests.is_dir():
        return out
    for host in _subdirs(manifests):
        for namespace in _subdirs(host):
            for model in _subdirs(namespace):
                for tag in sorted(model.iterdir()):
                    if tag.is_file() and not tag.name.startswith("."):
                        name = refs.OllamaName(host.name, namespace.name, model.name, tag.name)
                        out.append(_ollama_candidate(root, name, tag))
    return out


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _ollama_candidate(root: Path, oname: refs.OllamaName, manifest: Path) -> _Candidate:
    ref = f"ollama:{oname.short}"
    hint = _REFETCH["ollama"].format(ollama=oname.short)

    def broken(problem: str, path: Path = manifest, size: int = 0,
               sha: str | None = None) -> _Candidate:
        return _Candidate(ref, "ollama", path, size, sha256=sha, problem=f"{problem}; {hint}",
                          hint=hint, ollama=oname.canonical)

    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        return broken(f"cannot read its manifest {manifest} ({e})")
    except ValueError as e:
        return broken(f"its manifest {manifest} is not valid JSON ({e})")
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list):
        layers = []
    model_layers = [layer for layer in layers if isinstance(layer, dict)
                    and layer.get("mediaType") == OLLAMA_MODEL_LAYER]
    if not model_layers:
        return broken(f"its manifest {manifest} names no layer of mediaType {OLLAMA_MODEL_LAYER}")
    layer = model_layers[0]
    digest = layer.get("digest")
    algo, _, hexdigest = digest.partition(":") if isinstance(digest, str) else ("", "", "")
    if algo != "sha256" or not _SHA256_HEX.match(hexdigest):
        return broken(f"its manifest {manifest} names the model blob {digest!r}, not "
                      "sha256:<64 hex digits>")
    blobs = root / "blobs"
    # ollama names blobs sha256-<hex>; older versions wrote sha256:<hex>
    blob = next((b for b in (blobs / f"sha256-{hexdigest}", blobs / f"sha256:{hexdigest}")
                 if b.is_file()), blobs / f"sha256-{hexdigest}")
    if not blob.is_file():
        return broken(f"its manifest {manifest} names the blob {blob}, which is missing",
                      path=blob, sha=hexdigest)
    size = _size(blob)
    want = layer.get("size")
    if isinstance(want, int) and want != size:
        return broken(f"the blob {blob} has {size} bytes, its manifest says {want}: it is "
                      "truncated or was changed", path=blob, size=size, sha=hexdigest)
    return _Candidate(ref, "ollama", blob, size, sha256=hexdigest, hint=hint,
                      ollama=oname.canonical)


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
