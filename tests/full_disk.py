"""A full disk for tests: a small tmpfs filled to the last block where the tests run as root,
else the one atomic-write helper (edgespec.statefile._write_all) made to fail with ENOSPC.

    with full_disk(tmp_path, monkeypatch) as disk:
        ...  # disk.root: a directory on the full filesystem; disk.real: a tmpfs or the stand-in
"""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Disk:
    root: Path
    real: bool  # a mounted tmpfs (else the ENOSPC stand-in)

    def fill(self) -> None:
        """Take every free block (the tmpfs only; the stand-in is always full)."""
        if not self.real:
            return
        with open(self.root / "filler", "ab", buffering=0) as f:
            for size in (1 << 16, 4096, 512, 1):  # the last blocks, then the last bytes
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / "filler").unlink()


def _mount(mnt: Path, size_kib: int) -> bool:
    if os.geteuid() != 0 or os.environ.get("EDGESPEC_TEST_NO_TMPFS"):  # the stand-in
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs",
                        str(mnt)], capture_output=True)
    return r.returncode == 0


@contextlib.contextmanager
def full_disk(tmp_path: Path, monkeypatch, size_kib: int = 512):
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    real = _mount(mnt, size_kib)
    disk = Disk(mnt, real)
    try:
        if not real:
            from edgespec import statefile

            def enospc(f, chunks):
                f.write(b"partial")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(statefile, "_write_all", enospc)
        yield disk
    finally:
        if real:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def temps(directory: Path) -> list[str]:
    """Temporary files a writer left in ``directory`` (and below)."""
    return sorted(p.name for p in directory.rglob(".*.tmp"))
