"""The digests recorded at a Hub file's first pull ($EDGESPEC_HOME/hub-pins.json), keyed
by repo, commit and file name, and the check of a fetched file against them."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ...errors import ModelError
from ...paths import edgespec_home
from .ref import HubRef
from ..store import (Progress, _atomic_write_text, _human, _model_lock, _write_stamp, sha256_file,
                    stamp_matches)

_PINS_SCHEMA = 1


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
