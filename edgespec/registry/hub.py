"""Hugging Face Hub references -> a verified local GGUF file.

    hf://OWNER/REPO/PATH/FILE.gguf          a file of the repo's default branch (main)
    hf://OWNER/REPO@REV/PATH/FILE.gguf      at a branch, tag or commit (huggingface_hub's
    hf://OWNER/REPO/PATH/FILE.gguf@REV      hf:// form; a trailing @REV is read the same)
    OWNER/REPO:QUANT                        the repo's GGUF file whose name carries QUANT
    OWNER/REPO[@REV]                        (case-insensitive), as llama.cpp's ``-hf``; without
    hf.co/OWNER/REPO:QUANT                  a quant, Q4_K_M; ``hf.co/`` is ollama's spelling

Downloads go through ``huggingface_hub`` (``hf_hub_download``): its cache (``HF_HOME`` /
``HF_HUB_CACHE``), its in-download resume (a dropped connection is retried with a Range
request), ``HF_TOKEN``, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and its progress bars. The
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

import contextlib
import errno
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError
from ..paths import edgespec_home
from .store import (Progress, _atomic_write_text, _human, _model_lock, _say, _write_stamp,
                    check_gguf, sha256_file, stamp_matches)
from .store import Verification

SCHEME = "hf://"
DEFAULT_QUANT = "Q4_K_M"

# huggingface_hub's repo id rules (validate_repo_id): letters, digits, '-', '_', '.'
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REV = r"[^\s@:]+"
_SHORT_RE = re.compile(rf"^(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?"
                       rf"(?P<repo>{_PART}/{_PART})(?:@(?P<rev>{_REV}))?"
                       rf"(?::(?P<quant>[A-Za-z0-9][A-Za-z0-9_.-]*))?$")
_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# quant labels as GGUF file names carry them (Q4_K_M, IQ2_XS, Q8_0, F16, BF16, ...)
_QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])",
                       re.IGNORECASE)
_PINS_SCHEMA = 1
# bytes kept free beyond the download itself (the cache's own metadata, our stamps)
_SLACK = 64 << 20


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class HubRef:
    """A parsed Hub reference: a repo, an optional revision and either a file or a quant."""

    repo: str
    revision: str | None = None  # None: the default branch
    filename: str | None = None  # hf:// names a file; the shorthand names a quant
    quant: str | None = None
    text: str = ""

    @property
    def rev(self) -> str:
        return self.revision or "main"

    def uri(self, filename: str | None = None, revision: str | None = None) -> str:
        """The canonical hf:// form (huggingface_hub's): ``hf://owner/repo[@rev]/file``."""
        rev = revision or self.revision
        return f"{SCHEME}{self.repo}{'@' + rev if rev else ''}/{filename or self.filename}"

    def __str__(self) -> str:
        return self.text or (self.uri() if self.filename else
                             f"{self.repo}{'@' + self.revision if self.revision else ''}"
                             f"{':' + self.quant if self.quant else ''}")


def is_hub_ref(name: str | os.PathLike) -> bool:
    """Whether `name` is a Hub reference: any ``hf://…``, or ``owner/repo[:QUANT]`` that is
    not a file or folder here (a local path always wins over the shorthand)."""
    if isinstance(name, os.PathLike):
        return False
    s = str(name)
    if s.startswith(SCHEME):
        return True
    if s.lower().endswith(".gguf") or not _SHORT_RE.match(s):
        return False
    return not Path(s).expanduser().exists()


def parse(text: str) -> HubRef:
    """Parse a Hub reference; ModelError saying how to write it when it is malformed."""
    s = str(text).strip()
    if s.startswith(SCHEME):
        return _parse_uri(s)
    m = _SHORT_RE.match(s)
    if not m:
        raise ModelError(f"{text!r} is not a Hugging Face reference; write hf://OWNER/REPO/FILE.gguf "
                         "or OWNER/REPO:QUANT (e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M)")
    return HubRef(repo=m["repo"], revision=m["rev"], quant=m["quant"], text=s)


def _parse_uri(s: str) -> HubRef:
    how = ("write hf://OWNER/REPO/FILE.gguf (a file in a folder: hf://OWNER/REPO/DIR/FILE.gguf; "
           "a revision: hf://OWNER/REPO@REV/FILE.gguf)")
    body = s[len(SCHEME):]
    if body.startswith("models/"):  # huggingface_hub's explicit repo type
        body = body[len("models/"):]
    elif body.split("/", 1)[0] in ("datasets", "spaces", "buckets", "kernels"):
        raise ModelError(f"{s}: only model repositories hold GGUF models; {how}")
    parts = body.split("/")
    if len(parts) < 3 or not all(parts):
        raise ModelError(f"{s}: names no file in a repository; {how}")
    owner, name, path = parts[0], parts[1], "/".join(parts[2:])
    revision = None
    if "@" in name:
        name, revision = name.split("@", 1)
    elif "@" in parts[-1] and parts[-1].rsplit("@", 1)[0].lower().endswith(".gguf"):
        path, revision = path.rsplit("@", 1)
    if not re.fullmatch(_PART, owner) or not re.fullmatch(_PART, name):
        raise ModelError(f"{s}: {owner}/{name} is not a repository id (letters, digits, "
                         f"'-', '_', '.'); {how}")
    if revision is not None and not re.fullmatch(_REV, revision):
        raise ModelError(f"{s}: {revision!r} is not a revision; {how}")
    if not path.lower().endswith(".gguf"):
        raise ModelError(f"{s}: {path} is not a .gguf file; name the GGUF file of the repo, "
                         f"or write {owner}/{name}:QUANT to pick it by quant")
    if ".." in path.split("/"):
        raise ModelError(f"{s}: a file path in a repository has no '..'; {how}")
    return HubRef(repo=f"{owner}/{name}", revision=revision, filename=path, text=s)


# --------------------------------------------------------------------------- environment


@dataclass(frozen=True)
class _Env:
    endpoint: str
    cache_dir: Path
    offline: bool  # HF_HUB_OFFLINE set

    @property
    def token(self) -> bool:
        from huggingface_hub import get_token
        return get_token() is not None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _env() -> _Env:
    """huggingface_hub's settings as the environment says now (its constants module read
    them once, at import), with the precedence it documents."""
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "huggingface")
        cache = os.path.join(os.path.expandvars(os.path.expanduser(home)), "hub")
    offline = _truthy(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    return _Env(endpoint=endpoint,
                cache_dir=Path(os.path.expandvars(os.path.expanduser(cache))), offline=offline)


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


# --------------------------------------------------------------------------- pins


def pins_path() -> Path:
    """Where the digests recorded at first pulls live."""
    return edgespec_home() / "hub-pins.json"


def _pin_key(repo: str, commit: str, filename: str) -> str:
    return f"{repo}@{commit}/{filename}"


def _read_pins() -> dict:
    path = pins_path()
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read the Hub pins ({e}); move the file away to "
                         "pin every Hub model afresh at its next pull") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        raise ModelError(f"{path}: not a Hub pins file (no \"files\" table); move it away to "
                         "pin every Hub model afresh at its next pull")
    return files


def pin(repo: str, commit: str, filename: str) -> dict | None:
    """The pin of one file: {"sha256", "size", "pinned_at"} or None."""
    entry = _read_pins().get(_pin_key(repo, commit, filename))
    return entry if isinstance(entry, dict) else None


def _write_pin(key: str, sha: str, size: int, say: Progress) -> None:
    with _model_lock("hub-pins", say):
        files = _read_pins()
        files[key] = {"sha256": sha, "size": size, "pinned_at": time.time()}
        _atomic_write_text(pins_path(), json.dumps({"schema": _PINS_SCHEMA, "files": files},
                                                   indent=1, sort_keys=True))


def _check(ref: HubRef, commit: str, filename: str, path: Path, hub_sha: str | None,
           force: bool, say: Progress) -> None:
    """Check one fetched file against its pin (pinning it at the first pull)."""
    key = _pin_key(ref.repo, commit, filename)
    known = pin(ref.repo, commit, filename)
    size = path.stat().st_size
    if known and not force and stamp_matches(path, known.get("sha256"), known.get("size")):
        return  # hashed to its pin and unchanged since
    say(f"checking the sha256 of {filename} ({_human(size)})")
    sha = sha256_file(path)
    again = f"`edgespec models pull {ref} --force`"
    if known is not None and not force:
        if known.get("sha256") != sha or known.get("size") != size:
            when = time.strftime("%Y-%m-%d", time.gmtime(known.get("pinned_at") or 0))
            raise ModelError(f"refusing {ref}: {filename} at commit {commit[:12]} has sha256 "
                             f"{sha} ({size} bytes), but it was {known.get('sha256')} "
                             f"({known.get('size')} bytes) when first pulled on {when}. If you "
                             f"trust the new file, {again} downloads it again and pins what "
                             "it gets")
    else:  # a first pull, or --force: what arrived becomes the pin, if it is what the Hub lists
        if hub_sha and sha != hub_sha:
            raise ModelError(f"{ref}: {path} has sha256 {sha}, but the Hub lists {hub_sha} for "
                             f"{filename}: the download is corrupt. Fetch it again with {again}")
        if known and known.get("sha256") != sha:
            say(f"{filename}: accepted the new file (sha256 {sha}, was {known.get('sha256')})")
        _write_pin(key, sha, size, say)
    _write_stamp(path, sha)


# --------------------------------------------------------------------------- download


def _free_bytes(where: Path) -> int:
    for p in (where, *where.parents):  # the cache folder may not exist yet
        with contextlib.suppress(OSError):
            return shutil.disk_usage(p).free
    return 1 << 62  # nothing to measure: let the download find out


def _cached(ref: HubRef, commit: str, filename: str, env: _Env) -> Path | None:
    from huggingface_hub import try_to_load_from_cache
    hit = try_to_load_from_cache(ref.repo, filename, cache_dir=str(env.cache_dir),
                                 revision=commit)
    return Path(hit) if isinstance(hit, str) else None


def _download(ref: HubRef, listing: _Listing, filename: str, env: _Env, force: bool) -> Path:
    cached = _cached(ref, listing.commit, filename, env)
    if cached is not None and not force:  # the listing named this commit: nothing to ask
        return cached
    from huggingface_hub import hf_hub_download
    try:
        # by the revision asked for, so the cache records where it points (offline use)
        got = hf_hub_download(ref.repo, filename, revision=ref.rev, cache_dir=str(env.cache_dir),
                              endpoint=env.endpoint, force_download=force)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise ModelError(f"{ref}: the disk filled up while downloading {filename} into "
                             f"{env.cache_dir}; free some space (or point HF_HOME at a larger "
                             "disk) and pull again") from None
        raise _hub_error(e, ref, env, filename) from None
    except Exception as e:  # noqa: BLE001 - mapped to what the user should do, or re-raised
        raise _hub_error(e, ref, env, filename) from None
    path = Path(got)
    # the branch may have moved between the listing and this download: the pin is per commit
    now = _cached(ref, listing.commit, filename, env)
    if now is None or now.resolve() != path.resolve():
        raise ModelError(f"{ref}: {ref.rev} moved to a new commit while pulling; pull again")
    return path


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
    info = check_gguf(paths[0])
    for path in paths[1:]:  # a truncated part fails here, before llama.cpp reads it
        check_gguf(path)
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


# --------------------------------------------------------------------------- errors


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _unreachable(e: BaseException) -> bool:
    """A network failure (no route, refused, timed out, dropped mid-body), whichever HTTP
    library this huggingface_hub uses (httpx in 1.x and later, requests before)."""
    from huggingface_hub.utils import OfflineModeIsEnabled
    if isinstance(e, (OfflineModeIsEnabled, ConnectionError, TimeoutError)):
        return True
    root = type(e).__module__.split(".", 1)[0]
    if root in {"httpx", "httpx2", "httpcore", "urllib3"}:
        return "StatusError" not in type(e).__name__  # an HTTP status is an answer
    if root == "requests":
        return type(e).__name__ in {"ConnectionError", "Timeout", "ConnectTimeout",
                                    "ReadTimeout", "ChunkedEncodingError"}
    return False


def _hub_error(e: BaseException, ref: HubRef, env: _Env, filename: str | None = None) -> ModelError:
    from huggingface_hub.utils import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                       LocalEntryNotFoundError, RepositoryNotFoundError,
                                       RevisionNotFoundError)
    login = "set HF_TOKEN to a token of yours (or run `huggingface-cli login`)"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, GatedRepoError) or (status in (401, 403) and not isinstance(
            e, RepositoryNotFoundError)):
        if env.token:
            return ModelError(f"{ref}: {ref.repo} is gated and your token has no access to it "
                              f"({status}); accept its terms on {env.endpoint}/{ref.repo} with "
                              "the account of that token, or use another token in HF_TOKEN")
        return ModelError(f"{ref}: {ref.repo} is gated ({status}): accept its terms on "
                          f"{env.endpoint}/{ref.repo}, then {login}")
    if isinstance(e, RepositoryNotFoundError):
        private = ("" if env.token else
                   f"; if it is private or gated, {login}")
        return ModelError(f"{ref}: no repository {ref.repo} on {env.endpoint} ({status}); check "
                          f"the owner and name{private}")
    if isinstance(e, RevisionNotFoundError):
        return ModelError(f"{ref}: {ref.repo} has no revision {ref.rev}; give a branch, tag or "
                          "commit that exists (or leave @REV out for main)")
    if isinstance(e, LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE is set" if env.offline else f"the Hub at {env.endpoint} is unreachable"
        fix = "unset HF_HUB_OFFLINE to download it" if env.offline else \
            "check the network (or HF_ENDPOINT) and pull again"
        return ModelError(f"{ref}: {filename or ''} is not in the Hugging Face cache "
                          f"{env.cache_dir} and {why}; {fix}")
    if isinstance(e, EntryNotFoundError):
        return ModelError(f"{ref}: {ref.repo}@{ref.rev} has no file {filename}; list its files "
                          f"on {env.endpoint}/{ref.repo}")
    if _unreachable(e):
        return ModelError(f"{ref}: the download of {filename or ref.repo} from {env.endpoint} "
                          f"failed ({_short(e)}) after huggingface_hub's retries; nothing was "
                          "kept as a model. Pull again when the network is back")
    if isinstance(e, HfHubHTTPError):
        return ModelError(f"{ref}: the Hub at {env.endpoint} answered {status or 'an error'} "
                          f"({_short(e)}); try again later")
    if isinstance(e, OSError):
        return ModelError(f"{ref}: {filename or ref.repo}: {_short(e)}; pull again "
                          f"(`edgespec models pull {ref} --force` fetches it afresh)")
    raise e
