"""Downloading one file of a Hub commit into the Hugging Face cache."""
from __future__ import annotations

import contextlib
import errno
import shutil
from pathlib import Path

from ..errors import ModelError
from .hub_errors import _hub_error
from .hub_listing import _Env, _Listing
from .hub_ref import HubRef


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
