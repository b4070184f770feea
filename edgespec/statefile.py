"""State files written whole or not at all: the one helper every state writer goes through.

edgespec keeps small state under $EDGESPEC_HOME (the user registry, qualification
records, digest stamps, saved chat sessions, calibrations) that several commands and
processes write. Each write here

- goes to a temporary file in the same directory (``.NAME.PID.RANDOM.tmp``), is flushed and
  fsynced, then renamed over the old file and the directory fsynced: a reader sees the old
  contents or the new, never half a file, and a crash or ``kill -9`` loses nothing that was
  already written;
- on failure (a full disk, a read-only or foreign home) removes its temporary file and raises
  :class:`StateFileError`, one line saying what to do, with the old file untouched;

:func:`locked` serialises read-modify-write cycles across processes (an advisory ``flock``
on a lock file beside the state), and :func:`clean_temps` removes what killed writers left
(temporary files whose process is gone), which every writer's directory gets on its next
start. :func:`check_writable` lets a long run (``edgespec qualify``) find out before it
starts that it could not record its result.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence, Union

from .errors import EdgespecError

Data = Union[bytes, str, Sequence[bytes]]

TEMP_SUFFIX = ".tmp"
# temporary files of older edgespec versions carry no process id: removed once this old
LEGACY_TEMP_AGE_SECONDS = 3600.0


class StateFileError(EdgespecError):
    """A state file could not be written (full disk, read-only or foreign directory)."""


def explain(e: OSError, path: Path, what: str) -> str:
    """One line for an OSError while writing ``what`` at ``path``: the cause and the fix."""
    code = e.errno
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return (f"cannot write the {what} {path}: no space left on the device (or the quota "
                f"is used up); free some space and try again (what was saved before is "
                f"unchanged)")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (f"cannot write the {what} {path}: {e.strerror or 'not writable'}; make the "
                "directory writable, or set EDGESPEC_HOME to a writable directory")
    return f"cannot write the {what} {path}: {e.strerror or e}"


def _fsync_dir(directory: Path) -> None:
    # the rename is durable once the directory entry is; not every platform can open a dir
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def temp_path(path: Path) -> Path:
    """Where a write of ``path`` goes first: hidden, beside it, named by this process."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def atomic_write(path: str | os.PathLike, data: Data, *, what: str = "state file",
                 mode: int = 0o644) -> Path:
    """Write ``data`` (text as UTF-8, bytes, or a sequence of byte chunks) to ``path``
    atomically and durably (see the module docstring); StateFileError on failure."""
    path = Path(path)
    chunks: Sequence[bytes]
    if isinstance(data, str):
        chunks = (data.encode("utf-8"),)
    elif isinstance(data, (bytes, bytearray, memoryview)):
        chunks = (bytes(data),)
    else:
        chunks = data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StateFileError(explain(e, path.parent, f"directory for the {what}")) from None
    tmp = temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as e:
        raise StateFileError(explain(e, path, what)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            _write_all(f, chunks)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StateFileError(explain(e, path, what)) from None
    except BaseException:  # KeyboardInterrupt mid-write: the old file stays, the temp goes
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def _write_all(f, chunks: Sequence[bytes]) -> None:  # type: ignore[no-untyped-def]
    """Every byte on the disk, not in a cache: a full disk fails here, not after the rename
    (tests stand in a full disk by making this raise ENOSPC where no tmpfs can be mounted)."""
    for chunk in chunks:
        f.write(chunk)
    f.flush()
    os.fsync(f.fileno())


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's live process: not ours to judge
    return True


def _writer_pid(name: str) -> int | None:
    """The process id in a temporary file's name (``.NAME.PID.RANDOM.tmp``), else None."""
    parts = name[: -len(TEMP_SUFFIX)].rsplit(".", 2)
    if len(parts) == 3 and parts[1].isdigit() and len(parts[2]) == 8:
        return int(parts[1])
    return None


def clean_temps(directory: str | os.PathLike, now: float | None = None) -> list[Path]:
    """Remove temporary files of writers that were killed: named by a process that is gone,
    or (older versions' names, no process id) older than an hour. Returns what was removed;
    never raises (cleaning is best effort, a later start tries again)."""
    d = Path(directory)
    removed: list[Path] = []
    now = time.time() if now is None else now
    try:
        candidates = [p for p in d.iterdir() if p.name.startswith(".")
                      and p.name.endswith(TEMP_SUFFIX) and p.is_file()]
    except OSError:
        return removed
    for p in candidates:
        pid = _writer_pid(p.name)
        try:
            stale = (not _pid_alive(pid)) if pid is not None else (
                now - p.stat().st_mtime > LEGACY_TEMP_AGE_SECONDS)
            if stale:
                p.unlink()
                removed.append(p)
        except OSError:
            continue
    return removed


@contextlib.contextmanager
def locked(lock_path: str | os.PathLike, *, what: str = "state file",
           waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (created if need be) for a
    read-modify-write cycle; other processes wait. ``waiting`` is told when it must wait."""
    lock_path = Path(lock_path)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StateFileError(explain(e, lock_path, f"lock of the {what}")) from None
    try:
        try:
            # deferred: POSIX only; other platforms take the fallback below
            import fcntl
        except ImportError:  # Windows: no advisory locks; concurrent writers are the user's call
            fcntl = None  # type: ignore[assignment]
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting is not None:
                    waiting(f"waiting for another edgespec process writing the {what}")
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def check_writable(directory: str | os.PathLike, *, what: str = "results",
                   need_bytes: int = 64 << 10) -> None:
    """StateFileError unless ``directory`` takes a new file and has ``need_bytes`` free:
    asked before a long run whose result must be written at its end."""
    d = Path(directory)
    probe = d / ".edgespec-write-probe"
    try:
        atomic_write(probe, b"x" * 4096, what=what)  # creates the directory too
    except StateFileError as e:  # name the directory, not the probe
        raise StateFileError(str(e).replace(str(probe), str(d))) from None
    with contextlib.suppress(OSError):
        probe.unlink()
    try:
        free = shutil.disk_usage(d).free
    except OSError:
        return
    if free < need_bytes:
        raise StateFileError(explain(OSError(errno.ENOSPC, "No space left on device"), d, what))
