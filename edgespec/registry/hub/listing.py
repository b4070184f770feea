"""What a Hub reference names: the files of the commit its revision resolves to (from the
Hub, or the cache when offline), and the file or split set to fetch."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ModelError
from .env import _Env
from .errors import _hub_error, _short, _unreachable
from .ref import DEFAULT_QUANT, HubRef
from ..store import Progress

_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# quant labels as GGUF file names carry them (Q4_K_M, IQ2_XS, Q8_0, F16, BF16, ...)
_QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])",
                       re.IGNORECASE)


# --------------------------------------------------------------------------- listing


@dataclass
class _Listing:
    """The files of one commit of a repo: from the Hub, or from the cache when offline."""

    commit: str
    files: dict[str, int | None]  # path in repo -> size (None when unknown)
    sha256: dict[str, str] = field(default_factory=dict)  # LFS sha256 the Hub states
    from_cache: bool = False
    why_cache: str = ""  # why the Hub was not asked, and what to do about it


def _listing(ref: HubRef, env: _Env, pull: bool, say: Progress) -> _Listing:
    if env.offline:
        return _cached_listing(ref, env, "HF_HUB_OFFLINE is set", "unset it to download")
    if not pull:
        return _cached_listing(ref, env, "it is not pulled yet",
                               f"run `edgespec models pull {ref}`")
    # deferred: huggingface_hub is slow to import and only some calls need it
    from huggingface_hub import HfApi
    try:
        info = HfApi(endpoint=env.endpoint).model_info(ref.repo, revision=ref.revision,
                                                       files_metadata=True)
    except Exception as e:  # noqa: BLE001 - mapped to what the user should do, or re-raised
        if _unreachable(e):
            say(f"the Hub at {env.endpoint} is unreachable ({_short(e)}); looking in the cache")
            return _cached_listing(ref, env, f"the Hub at {env.endpoint} is unreachable "
                                             f"({_short(e)})", "check the network (or "
                                   "HF_ENDPOINT) and pull it again")
        raise _hub_error(e, ref, env) from None
    files, shas = {}, {}
    for s in info.siblings or []:
        files[s.rfilename] = s.size
        if s.lfs is not None and getattr(s.lfs, "sha256", None):
            shas[s.rfilename] = s.lfs.sha256
    if not info.sha:
        raise ModelError(f"{env.endpoint} answered for {ref.repo} without a commit; HF_ENDPOINT "
                         "must point at a Hugging Face Hub (or a mirror of its API)")
    return _Listing(commit=info.sha, files=files, sha256=shas)


def _cached_listing(ref: HubRef, env: _Env, reason: str, fix: str) -> _Listing:
    """The cached snapshot of `ref`'s revision (huggingface_hub.scan_cache_dir), or a
    ModelError that says why nothing could be downloaded (`reason`) and what to do."""
    # deferred: huggingface_hub is slow to import and only some calls need it
    from huggingface_hub import scan_cache_dir
    nothing = ModelError(f"{ref}: not in the Hugging Face cache {env.cache_dir} and "
                         f"{reason}; {fix}")
    try:
        cache = scan_cache_dir(env.cache_dir)
    except Exception:  # CacheNotFound: no cache at all
        raise nothing from None
    repo = next((r for r in cache.repos if r.repo_id == ref.repo and r.repo_type == "model"),
                None)
    if repo is None:
        raise nothing
    rev = ref.rev
    chosen = next((r for r in repo.revisions if rev in r.refs or r.commit_hash == rev), None)
    if chosen is None:
        raise ModelError(f"{ref}: the Hugging Face cache {env.cache_dir} holds {ref.repo} but "
                         f"not its revision {rev}, and {reason}; {fix}")
    files = {}
    for f in chosen.files:
        rel = Path(f.file_path).relative_to(chosen.snapshot_path).as_posix()
        files[rel] = f.size_on_disk
    return _Listing(commit=chosen.commit_hash, files=files, from_cache=True,
                    why_cache=f"{reason}; {fix}")


# --------------------------------------------------------------------------- choosing files


def _ggufs(listing: _Listing) -> list[str]:
    # mmproj files are vision projectors that ride along in many repos, not language models
    return sorted(f for f in listing.files if f.lower().endswith(".gguf")
                  and "mmproj" not in f.rsplit("/", 1)[-1].lower())


def _split_parts(filename: str) -> list[str]:
    """Every part of the split set `filename` belongs to (itself alone when not split)."""
    m = _SPLIT_RE.match(filename)
    if not m:
        return [filename]
    count = int(m["count"])
    return [f"{m['base']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _set_name(filename: str) -> str:
    m = _SPLIT_RE.match(filename)
    return f"{m['base']}.gguf ({int(m['count'])} parts)" if m else filename


def _quants(files: list[str]) -> list[str]:
    found = []
    for f in files:
        for q in _QUANT_RE.findall(f.rsplit("/", 1)[-1]):
            if q.upper() not in found:
                found.append(q.upper())
    return found


def _pick(ref: HubRef, listing: _Listing, env: _Env) -> list[str]:
    """The files to fetch, the one to load first: one file, or every part of a split set."""
    ggufs = _ggufs(listing)
    where = f"{ref.repo}@{listing.commit[:12]}" + (" (cached)" if listing.from_cache else "")
    uncached = ModelError(f"{ref}: not in the Hugging Face cache {env.cache_dir} and "
                          f"{listing.why_cache}")
    if ref.filename is not None:
        if ref.filename not in listing.files and listing.from_cache:
            raise uncached
        if ref.filename not in listing.files:
            hint = (f"its GGUF files: {', '.join(ggufs[:12])}{' ...' if len(ggufs) > 12 else ''}"
                    if ggufs else "it has no GGUF files")
            raise ModelError(f"{ref}: {where} has no file {ref.filename}; {hint}")
        parts = _split_parts(ref.filename)
    else:
        quant = ref.quant or DEFAULT_QUANT
        pat = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
        matches = [f for f in ggufs if pat.search(f.rsplit("/", 1)[-1])]
        sets = {}
        for f in matches:  # a split set is one candidate, whichever part matched
            parts = _split_parts(f)
            sets.setdefault(parts[0], parts)
        if not sets and listing.from_cache:
            raise uncached
        if not sets:
            have = _quants(ggufs)
            if not ggufs:
                raise ModelError(f"{ref}: {where} has no GGUF files; pick a repository that "
                                 "ships GGUF (its name usually ends in -GGUF)")
            which = (f"its quants: {', '.join(have)}" if have else
                     f"its GGUF files: {', '.join(ggufs[:12])}")
            ask = "no :QUANT was given and it has no Q4_K_M file" if ref.quant is None \
                else f"no GGUF file carries {quant}"
            raise ModelError(f"{ref}: {where}: {ask}; {which}. Write {ref.repo}:QUANT with one "
                             "of them, or hf://OWNER/REPO/FILE.gguf for one file")
        if len(sets) > 1:
            names = ", ".join(_set_name(f) for f in sorted(sets))
            raise ModelError(f"{ref}: several GGUF files of {where} carry {quant}: {names}; "
                             f"name one with hf://{ref.repo}/FILE.gguf")
        parts = next(iter(sets.values()))
    missing = [p for p in parts if p not in listing.files]
    if missing and listing.from_cache:
        raise ModelError(f"{ref}: {_set_name(parts[0])} is a split set and the Hugging Face "
                         f"cache {env.cache_dir} lacks {', '.join(missing)}; "
                         f"{listing.why_cache}")
    if missing:
        raise ModelError(f"{ref}: {_set_name(parts[0])} is a split set, but {where} lacks "
                         f"{', '.join(missing)}; the set is incomplete, so nothing was "
                         "downloaded. Tell the repository's owner, or pick another file")
    return parts
