"""What a model file is: its sha256 (computed once per path, size and mtime, and kept beside
the calibrations), size and name, and its vocabulary's digest. The calibration cache, the
engine, the bridge pins and the release identity (edgespec.identity) key on them."""
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


def _vocabulary_cache() -> Path:
    return paths.edgespec_home() / "identity" / "vocabulary.json"


def vocabulary_digest(model, model_sha256: str | None = None) -> str:
    """sha256 over (text, attribute) of every token id in order; cached per model digest."""
    store = _vocabulary_cache()
    known: dict = {}
    if model_sha256:
        try:
            known = json.loads(store.read_text(encoding="utf-8"))
            if isinstance(known, dict) and isinstance(known.get(model_sha256), str):
                return known[model_sha256]
        except (OSError, ValueError):
            known = {}
    h = hashlib.sha256()
    for t in range(int(model.n_vocab)):
        h.update(model.token_text(t).encode("utf-8", "surrogatepass"))
        h.update(b"\0%d\n" % int(model.token_attr(t)))
    digest = h.hexdigest()
    if model_sha256:
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            known = known if isinstance(known, dict) else {}
            known[model_sha256] = digest
            tmp = store.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1), encoding="utf-8")
            os.replace(tmp, store)
        except OSError:
            pass  # a read-only home only costs the recomputation
    return digest
