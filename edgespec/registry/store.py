"""Pulled models on disk: where they live, their digest stamps, verification, locks.

    $EDGESPEC_HOME/models/<name>.gguf            the verified model (see edgespec.paths)
    $EDGESPEC_HOME/models/<name>.gguf.verified   JSON stamp: digest + size/mtime/inode it was computed for
    $EDGESPEC_HOME/models/.<name>.lock           serialises pulls of one model across processes

The stamp lets ``resolve`` skip re-hashing a file that has not changed since it was
verified; ``verify`` always re-hashes. A model of the user registry is the file its entry
pins (``ModelSpec.path``), checked against its digest the same way; its stamp lives in
``$EDGESPEC_HOME/models/local/`` rather than beside a file that is not ours. A bare local
``.gguf`` path gets the header check (``check_gguf``) but no digest check.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .. import statefile
from ..errors import ModelError
from ..runtime.gguf_header import GGUFInfo, read_gguf_header
from ..paths import models_dir
from .spec import ModelSpec, load_registry

_HASH_BLOCK = 4 << 20

Progress = Callable[[str], None]


def model_path(name: str) -> Path:
    """Where registry model `name` lives once pulled (whether or not it is there yet)."""
    return spec_file(load_registry().get(name))


def spec_file(spec: ModelSpec) -> Path:
    """The file of a model: the pinned local file of a user model, else the pulled one."""
    return spec.path if spec.path is not None else models_dir() / f"{spec.name}.gguf"


def _stamp_path(path: Path) -> Path:
    if path.parent == models_dir():
        return path.with_name(path.name + ".verified")
    # a user model's file: its directory may be read-only or someone else's
    key = hashlib.sha256(str(path.absolute()).encode()).hexdigest()[:16]
    return models_dir() / "local" / f"{key}-{path.name}.verified"


def refetch_hint(spec: ModelSpec) -> str:
    """What to do about a model file that is missing or does not match its pin."""
    if spec.derived is not None:
        return (f"make it again with `edgespec models optimize {spec.derived.source} --name "
                f"{spec.name} --force`")
    if spec.hub:
        return (f"pull it again with `edgespec models pull {spec.hub}` (the pinned commit), "
                f"or `edgespec models remove {spec.name}`")
    if spec.local:
        return (f"restore the file you added, or `edgespec models remove {spec.name}` and add "
                "it again")
    return f"re-pull it with `edgespec models pull {spec.name} --force`"


def is_path_like(name_or_path: str | os.PathLike) -> bool:
    if isinstance(name_or_path, os.PathLike):
        return True
    s = str(name_or_path)
    return (s.lower().endswith(".gguf") or "/" in s or os.sep in s
            or bool(os.altsep and os.altsep in s) or s.startswith("~"))


# --------------------------------------------------------------------------- checks


def check_gguf(path: str | os.PathLike) -> GGUFInfo:
    """Fast header validation (no hashing): raises ModelError saying what is wrong and what to do.

    See edgespec.runtime.gguf_header.read_gguf_header for what is checked. The first part
    of a split set (``NAME-00001-of-0000N.gguf``, what llama.cpp loads) is checked with
    every other part beside it: each present, each a GGUF header that is not truncated.
    """
    info = read_gguf_header(path)
    _check_split(Path(path), info)
    return info


_SPLIT_NAME = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def _check_split(path: Path, info: GGUFInfo) -> None:
    count, no = info.metadata.get("split.count"), info.metadata.get("split.no")
    if not isinstance(count, int) or count <= 1:
        return
    m = _SPLIT_NAME.match(path.name)
    if m is None or int(m["count"]) != count:
        raise ModelError(f"{path} is part {(no or 0) + 1} of a split set of {count}, but its "
                         f"name is not NAME-0000K-of-{count:05d}.gguf, so llama.cpp cannot find "
                         "the other parts; keep the names the set was written with")
    if no not in (0, None):
        first = path.with_name(f"{m['base']}-00001-of-{count:05d}.gguf")
        raise ModelError(f"{path} is part {no + 1} of {count} of a split set; give its first "
                         f"part, {first}, which llama.cpp loads the others from")
    parts = [path.with_name(f"{m['base']}-{i:05d}-of-{count:05d}.gguf")
             for i in range(2, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelError(f"{path} is the first of a split set of {count} parts and "
                         f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                         f"beside it in {path.parent}; download every part of "
                         f"{m['base']}-*-of-{count:05d}.gguf into that folder")
    for p in parts:
        read_gguf_header(p)  # a truncated part fails here, before llama.cpp reads it


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _file_identity(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = {"sha256": sha256, **_file_identity(path), "verified_at": time.time()}
    # a read-only or full cache still works, it just re-hashes
    with contextlib.suppress(OSError, statefile.StateFileError):
        _atomic_write_text(_stamp_path(path), json.dumps(stamp))


def _stamp_valid(path: Path, spec: ModelSpec) -> bool:
    return stamp_matches(path, spec.sha256, spec.size)


def stamp_matches(path: Path, sha256: str, size: int | None = None) -> bool:
    """Whether `path` was hashed to `sha256` (and has `size` bytes, when given) and has not
    changed since (size, mtime, inode): the check that lets a caller skip re-hashing it."""
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        ident = _file_identity(path)
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("sha256") == sha256
            and (size is None or ident["size"] == size)
            and all(stamp.get(k) == v for k, v in ident.items()))


@dataclass(frozen=True)
class Verification:
    path: Path
    ok: bool
    actual_sha256: str
    actual_size: int
    name: str | None = None  # the registry model it is (or matches, for a local path)
    expected_sha256: str | None = None
    expected_size: int | None = None
    message: str = ""


def _digest_mismatch(spec: ModelSpec, path: Path, sha: str, size: int) -> str:
    if size != spec.size:
        return (f"{spec.name}: {path} has {size} bytes, expected {spec.size} "
                f"(sha256 {sha}, expected {spec.sha256})")
    return f"{spec.name}: {path} has sha256 {sha}, expected {spec.sha256}"


def model_status(name: str) -> str:
    """Cheap status for listings (no hashing): "verified", "unverified" (present, digest not
    checked since it last changed), "wrong size", or "missing"."""
    spec = load_registry().get(name)
    path = spec_file(spec)
    if not path.is_file():
        return "missing"
    if path.stat().st_size != spec.size:
        return "wrong size"
    return "verified" if _stamp_valid(path, spec) else "unverified"


def _verify_existing(spec: ModelSpec, path: Path, say: Progress) -> Path:
    size = path.stat().st_size
    if size != spec.size:
        raise ModelError(f"{spec.name}: {path} has {size} bytes, expected {spec.size}; "
                         f"{refetch_hint(spec)}")
    say(f"checking the sha256 of {spec.name} ({_human(size)}), once")
    sha = sha256_file(path)
    if sha != spec.sha256:
        raise ModelError(_digest_mismatch(spec, path, sha, size) + f"; {refetch_hint(spec)}")
    _write_stamp(path, sha)
    return path


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def _model_lock(name: str, say: Progress) -> Iterator[None]:
    """An exclusive advisory lock per model (or state file: "user-registry",
    "qualification"), so concurrent pulls assemble a file once and concurrent writers of a
    state file never lose each other's update (edgespec.statefile.locked)."""
    lock_path = models_dir() / f".{name}.lock"
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(statefile.locked(
                lock_path, what=f"lock of {name}",
                waiting=lambda _: say(f"waiting for another process writing {name}")))
        except statefile.StateFileError as e:
            raise ModelError(str(e)) from None
        yield


def _atomic_write_text(path: Path, text: str, what: str = "file") -> None:
    """``text`` written whole or not at all (edgespec.statefile.atomic_write): a full disk
    is a StateFileError saying so, and the old file stays."""
    statefile.atomic_write(path, text, what=what)


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _say(message: str) -> None:
    print(f"edgespec: {message}", file=sys.stderr, flush=True)

