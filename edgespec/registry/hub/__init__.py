"""Hugging Face Hub references -> a verified local GGUF file.

    hf://OWNER/REPO/PATH/FILE.gguf          a file of the repo's default branch (main)
    hf://OWNER/REPO@REV/PATH/FILE.gguf      at a branch, tag or commit (huggingface_hub's
    hf://OWNER/REPO/PATH/FILE.gguf@REV      hf:// form; a trailing @REV is read the same)
    OWNER/REPO:QUANT                        the repo's GGUF file whose name carries QUANT
    OWNER/REPO[@REV]                        (case-insensitive), as llama.cpp's ``-hf``; without
    hf.co/OWNER/REPO:QUANT                  a quant, Q4_K_M; ``hf.co/`` is ollama's spelling

Downloads go through ``huggingface_hub`` (``hf_hub_download``): its cache (``HF_HOME`` /
``HF_HUB_CACHE``), its in-download resume (a dropped connection is retried with a Range
request; a partial download a killed pull left is finished by the next, hub/download.py), ``HF_TOKEN``, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and its progress bars. The
environment is read at each call, not when huggingface_hub was imported, so a long-lived
process (a server, a test session) sees the settings as they are now.

A split set (``NAME-00001-of-0000N.gguf``) is fetched whole and resolves to its first
part; llama.cpp opens the others itself, from the same snapshot folder.

Every file is pinned at its first pull in ``$EDGESPEC_HOME/hub-pins.json``, keyed by repo,
the commit the revision resolved to, and file name: sha256 and size. Later resolves check
the file against its pin, re-hashing only a file that changed since it was last verified
(the stamps of :mod:`edgespec.registry.store`). A file whose digest no longer matches is
refused; ``edgespec models pull REF --force`` downloads it again and pins what it gets.
huggingface_hub writes downloads to ``blobs/*.incomplete`` and links them into
``snapshots/`` only when complete; this module only ever opens ``snapshots/`` paths, so a
partial download never becomes a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelError
from .download import _cached, _download, _free_bytes
from .env import _env
from .listing import _cached_listing, _listing, _pick
from .pins import _check, pin, pins_path
from .ref import DEFAULT_QUANT, SCHEME, HubRef, is_hub_ref, parse
from ..store import Progress, Verification, _human, _say, _write_stamp, check_gguf, sha256_file

__all__ = ["DEFAULT_QUANT", "SCHEME", "Fetched", "HubRef", "fetch", "is_hub_ref", "parse",
           "pin", "pins_path", "pull", "resolve", "verify"]

# bytes kept free beyond the download itself (the cache's own metadata, our stamps)
_SLACK = 64 << 20


@dataclass(frozen=True)
class Fetched:
    """What a Hub reference resolved to."""

    path: Path  # the file to load: the first part of a split set
    parts: tuple[Path, ...]  # every file fetched, in order
    commit: str  # the commit the revision resolved to
    uri: str  # hf://owner/repo@commit/file: the same bytes again, whatever main points to


def resolve(ref: str | HubRef, pull: bool = True, force: bool = False,
            progress: Progress | None = None) -> Path:
    """A local, verified GGUF file for a Hub reference (the first part of a split set).

    ``pull``: download what the cache lacks (else only the cache is used, as with
    HF_HUB_OFFLINE). ``force``: download again and pin what arrives. ModelError for a
    malformed reference, a missing repo, revision or file, a gated repo without access,
    no network with nothing cached, too little disk, an incomplete split set, and a file
    whose digest differs from its pin.
    """
    return fetch(ref, pull=pull, force=force, progress=progress).path


def fetch(ref: str | HubRef, pull: bool = True, force: bool = False,
          progress: Progress | None = None) -> Fetched:
    """:func:`resolve`, returning every part and the commit too."""
    r = ref if isinstance(ref, HubRef) else parse(ref)
    say = progress or _say
    env = _env()
    listing = _listing(r, env, pull, say)
    parts = _pick(r, listing, env)
    todo = [p for p in parts if force or _cached(r, listing.commit, p, env) is None]
    if todo and listing.from_cache:  # nothing can be downloaded now
        if force:
            raise ModelError(f"{r}: --force downloads again, which needs the Hub; "
                             + ("unset HF_HUB_OFFLINE" if env.offline else
                                f"the Hub at {env.endpoint} is unreachable"))
        raise ModelError(f"{r}: {', '.join(todo)} not in the Hugging Face cache "
                         f"{env.cache_dir} and {listing.why_cache}")
    if todo:
        sizes = [listing.files.get(p) for p in todo]
        if all(s is not None for s in sizes):
            need = sum(sizes) + _SLACK
            free = _free_bytes(env.cache_dir)
            if free < need:
                raise ModelError(f"pulling {r} needs about {_human(need)} free in "
                                 f"{env.cache_dir}, only {_human(free)} left; free some space "
                                 "or point HF_HOME (or HF_HUB_CACHE) at a larger disk")
        total = sum(s or 0 for s in sizes)
        say(f"pulling {r.uri(parts[0], listing.commit[:12]) if len(parts) == 1 else r} "
            f"({_human(total)}{f', {len(todo)} parts' if len(todo) > 1 else ''}) "
            f"from {env.endpoint}")
    paths = [_download(r, listing, p, env, force) for p in parts]
    for p, path in zip(parts, paths):
        _check(r, listing.commit, p, path, listing.sha256.get(p), force, say)
    info = check_gguf(paths[0])  # a split set: every part beside it, none truncated
    count = info.metadata.get("split.count")
    if len(parts) > 1 and count != len(parts):
        raise ModelError(f"{r}: {parts[0]} says it is one of {count} parts, its name says "
                         f"{len(parts)}; the split set is inconsistent, pick another file")
    return Fetched(path=paths[0], parts=tuple(paths), commit=listing.commit,
                   uri=r.uri(parts[0], listing.commit))


def pull(ref: str | HubRef, force: bool = False, progress: Progress | None = None) -> Path:
    """Download (or find in the cache) and verify a Hub reference; its local path."""
    return resolve(ref, pull=True, force=force, progress=progress)


def verify(ref: str | HubRef, progress: Progress | None = None):
    """Re-hash a pulled Hub reference (every part of a split set) against its pins, from the
    cache alone. A mismatch is returned (ok=False), not raised; a reference that is not
    pulled raises ModelError. Returns a :class:`edgespec.registry.store.Verification` of
    the file it loads."""
    r = ref if isinstance(ref, HubRef) else parse(ref)
    say = progress or _say
    env = _env()
    listing = _cached_listing(r, env, "it is not pulled yet", f"run `edgespec models pull {r}`")
    parts = _pick(r, listing, env)
    results = []
    for p in parts:
        path = _cached(r, listing.commit, p, env)
        if path is None:
            raise ModelError(f"{r}: {p} is not in the Hugging Face cache {env.cache_dir}; run "
                             f"`edgespec models pull {r}`")
        known = pin(r.repo, listing.commit, p)
        if known is None:
            raise ModelError(f"{r}: {p} has no pin in {pins_path()} (it was not pulled by "
                             f"edgespec); run `edgespec models pull {r}` to record one")
        say(f"hashing {p} ({_human(path.stat().st_size)})")
        sha, size = sha256_file(path), path.stat().st_size
        ok = sha == known.get("sha256") and size == known.get("size")
        if ok:
            _write_stamp(path, sha)
        results.append((p, path, ok, sha, size, known))
    bad = [f"{p} has sha256 {sha} ({size} bytes), pinned {k.get('sha256')} ({k.get('size')} "
           "bytes)" for p, _, ok, sha, size, k in results if not ok]
    p, path, _, sha, size, known = results[0]
    message = "ok" if not bad else (f"{'; '.join(bad)}; `edgespec models pull {r} --force` "
                                    "downloads it again and pins what arrives")
    return Verification(path=path, ok=not bad, actual_sha256=sha, actual_size=size,
                        expected_sha256=known.get("sha256"), expected_size=known.get("size"),
                        message=message)
