"""What a model file is: its sha256 (computed once per path, size and mtime, and kept beside
the calibrations), size and name, and its vocabulary's digest. The calibration cache, the
engine, the bridge pins and the release identity (edgespec.identity) key on them."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from .. import paths, statefile
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
    def read() -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        return h.hexdigest()
    return _remembered(store, f"{path}|{st.st_size}|{st.st_mtime_ns}", read)


def _vocabulary_cache() -> Path:
    return paths.edgespec_home() / "identity" / "vocabulary.json"


def vocabulary_digest(model, model_sha256: str | None = None) -> str:
    """sha256 over (text, attribute) of every token id in order; cached per model digest."""
    def read() -> str:
        h = hashlib.sha256()
        for t in range(int(model.n_vocab)):
            h.update(model.token_text(t).encode("utf-8", "surrogatepass"))
            h.update(b"\0%d\n" % int(model.token_attr(t)))
        return h.hexdigest()
    return _remembered(_vocabulary_cache(), model_sha256, read) if model_sha256 else read()


def _remembered(store: Path, key: str, compute: Callable[[], str]) -> str:
    """``compute()``, kept in the JSON map ``store`` under ``key`` so that it runs once
    (statefile: a whole write, never half a file); a home that cannot be written only costs
    the recomputation."""
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    if isinstance(known.get(key), str):
        return known[key]
    value = known[key] = compute()
    with contextlib.suppress(statefile.StateFileError):
        statefile.atomic_write(store, json.dumps(known, indent=1), what="digest cache")
    return value
