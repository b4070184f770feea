"""Downloading one file of a Hub commit into the Hugging Face cache.

huggingface_hub resumes a dropped connection within one download (Range requests), but it
writes each download to a file of its own, ``blobs/<etag>.<random>.incomplete``, and never
reopens one another process left: a pull that was killed (Ctrl-C twice, a closed laptop, an
OOM kill) would start again from byte 0. So before handing a file to ``hf_hub_download``,
:func:`_resume_partial` looks for such a leftover of the same blob, takes huggingface_hub's
own lock on it (so a pull still running elsewhere is waited for, not raced), finishes it
with a Range request through huggingface_hub's ``http_get`` (its headers, token, retries and
progress bar), checks its sha256 against the etag the Hub names the blob by, and only then
renames it to ``blobs/<etag>``; ``hf_hub_download`` then links the finished blob into the
snapshot as it does for its own downloads. A leftover that does not verify is deleted, never
linked, so a partial download never becomes a model.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from ...errors import ModelError
from .errors import _hub_error
from .env import _Env
from .listing import _Listing
from .ref import HubRef
from ..store import sha256_file


def _free_bytes(where: Path) -> int:
    for p in (where, *where.parents):  # the cache folder may not exist yet
        with contextlib.suppress(OSError):
            return shutil.disk_usage(p).free
    return 1 << 62  # nothing to measure: let the download find out


def _cached(ref: HubRef, commit: str, filename: str, env: _Env) -> Path | None:
    # deferred: huggingface_hub is slow to import and only some calls need it
    from huggingface_hub import try_to_load_from_cache
    hit = try_to_load_from_cache(ref.repo, filename, cache_dir=str(env.cache_dir),
                                 revision=commit)
    return Path(hit) if isinstance(hit, str) else None


@contextlib.contextmanager
def _download_errors(ref: HubRef, env: _Env, filename: str, then: str) -> Iterator[None]:
    """A failed download as what the user should do: a full disk says so, the rest are
    mapped by the Hub's error (404, 401, offline, a dropped connection)."""
    try:
        yield
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise ModelError(f"{ref}: the disk filled up while downloading {filename} into "
                             f"{env.cache_dir}; free some space (or point HF_HOME at a larger "
                             f"disk) and {then}") from None
        raise _hub_error(e, ref, env, filename) from None
    except Exception as e:  # noqa: BLE001 - mapped to what the user should do, or re-raised
        raise _hub_error(e, ref, env, filename) from None


def _download(ref: HubRef, listing: _Listing, filename: str, env: _Env, force: bool) -> Path:
    cached = _cached(ref, listing.commit, filename, env)
    if cached is not None and not force:  # the listing named this commit: nothing to ask
        return cached
    # deferred: huggingface_hub is slow to import; only a pull needs it
    from huggingface_hub import hf_hub_download
    if not force:
        _resume_partial(ref, listing, filename, env)
    with _download_errors(ref, env, filename, then="pull again"):
        # by the revision asked for, so the cache records where it points (offline use)
        got = hf_hub_download(ref.repo, filename, revision=ref.rev, cache_dir=str(env.cache_dir),
                              endpoint=env.endpoint, force_download=force)
    path = Path(got)
    # the branch may have moved between the listing and this download: the pin is per commit
    now = _cached(ref, listing.commit, filename, env)
    if now is None or now.resolve() != path.resolve():
        raise ModelError(f"{ref}: {ref.rev} moved to a new commit while pulling; pull again")
    return path


def _blob_paths(ref: HubRef, etag: str, env: _Env) -> tuple[Path, Path]:
    """(the blob's path in the cache, huggingface_hub's lock file for it)."""
    # deferred: huggingface_hub is slow to import and only some calls need it
    from huggingface_hub.file_download import repo_folder_name
    folder = repo_folder_name(repo_id=ref.repo, repo_type="model")
    return (env.cache_dir / folder / "blobs" / etag,
            env.cache_dir / ".locks" / folder / f"{etag}.lock")


def partials(ref: HubRef, etag: str, env: _Env) -> list[Path]:
    """The partial downloads of blob `etag` in the cache, largest first."""
    blob, _ = _blob_paths(ref, etag, env)
    found = []
    for p in blob.parent.glob(f"{etag}*.incomplete") if blob.parent.is_dir() else ():
        with contextlib.suppress(OSError):
            found.append((p.stat().st_size, p))
    return [p for _, p in sorted(found, reverse=True)]


def _resume_partial(ref: HubRef, listing: _Listing, filename: str, env: _Env) -> None:
    """Finish the partial download of `filename` an earlier pull left behind, if any (see
    the module's docstring); nothing when there is none or the Hub names no sha256."""
    etag = listing.sha256.get(filename)  # an LFS file's etag, which names its blob
    if not etag or not partials(ref, etag, env):
        return
    # deferred: huggingface_hub is slow to import; only a resumed pull needs it
    from huggingface_hub.utils import WeakFileLock
    blob, lock = _blob_paths(ref, etag, env)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):  # a pull still running holds it: wait for that one instead
        left = partials(ref, etag, env)
        if blob.exists() or not left:
            for p in left:  # what dead pulls left of a blob that is complete now
                with contextlib.suppress(OSError):
                    p.unlink()
            return
        keep, stale = left[0], left[1:]
        for p in stale:
            with contextlib.suppress(OSError):
                p.unlink()
        if _finish(ref, listing, filename, env, keep, etag):
            os.replace(keep, blob)


def _finish(ref: HubRef, listing: _Listing, filename: str, env: _Env, part: Path,
            etag: str) -> bool:
    """Download the rest of `part`; whether it is now the complete, verified blob."""
    # deferred: huggingface_hub is slow to import and only some calls need it
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers
    size = listing.files.get(filename)
    have = part.stat().st_size
    if size is not None and have > size:  # not a prefix of this file: start afresh
        part.unlink()
        return False
    url = hf_hub_url(ref.repo, filename, revision=listing.commit, endpoint=env.endpoint)
    with _download_errors(ref, env, filename,
                          then="pull again: it goes on from where it stopped"):
        with open(part, "ab") as f:
            http_get(url, f, resume_size=have, headers=build_hf_headers(),
                     expected_size=size, displayed_filename=filename)
    sha = sha256_file(part)
    if sha != etag:
        part.unlink()
        raise ModelError(f"{ref}: the partial download of {filename} an earlier pull left did "
                         f"not complete to the file the Hub lists (sha256 {sha}, expected "
                         f"{etag}); it was deleted. Pull again to download it afresh")
    return True
