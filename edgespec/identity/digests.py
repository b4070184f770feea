"""A model file's identity: its sha256 (computed once per path, size and mtime, and kept
beside the calibrations), size and name. The calibration cache, the engine, the bridge
registry and the release identity key on it."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .. import paths
from ..errors import EdgespecError


def model_identity(path: str | os.PathLike, sha256: str | None = None,
                   home: Path | None = None) -> dict:
    """{"sha256", "size", "name"} of a model file; the digest is cached by (path, size, mtime)."""
    p = Path(path).expanduser().resolve()
    try:
        st = p.stat()
    except OSError as e:
        raise EdgespecError(f"cannot read model file {p}: {e.strerror}") from None
    if sha256 is None:
        # beside the calibrations, where the digests have always been kept (``home`` is an
        # $EDGESPEC_HOME override, as in edgespec.calibration.cache.folder)
        store = (Path(home) / "calibration" if home is not None else paths.calibration_dir())
        sha256 = _cached_digest(p, st, store / "digests.json")
    return {"sha256": sha256, "size": str(st.st_size), "name": p.name}


def _cached_digest(path: Path, st: os.stat_result, store: Path) -> str:
    stamp = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(stamp), str):
        return known[stamp]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        known = known if isinstance(known, dict) else {}
        known[stamp] = digest
        tmp = store.with_suffix(".tmp")
        tmp.write_text(json.dumps(known, indent=1), encoding="utf-8")
        os.replace(tmp, store)
    except OSError:
        pass
    return digest
