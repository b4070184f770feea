"""Listing one store: its GGUF files (a split set once, under its first part) and, for
ollama, the blobs its manifests name, as candidates whose headers are not read yet."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .. import refs
from .locations import (OLLAMA_MODEL_LAYER, _REFETCH, _SHA256_HEX, _SPLIT, Store,
                          _Candidate)


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
    # deferred: huggingface_hub is slow to import and only some calls need it
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
