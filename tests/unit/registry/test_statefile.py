"""edgespec.statefile: every state file written whole or not at all, a full disk one clear error
with the old file intact and no temporary file left, killed writers' leftovers cleaned,
concurrent writers serialised. (edgespec/statefile.py sits at the package root; its tests live
with the registry, its first user, as tests/unit mirrors packages only.)"""
from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest
from full_disk import full_disk, temps

from edgespec import statefile
from edgespec.statefile import StateFileError


def test_a_write_is_whole_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "deep" / "state.json"
    statefile.atomic_write(path, '{"a": 1}')
    statefile.atomic_write(path, [b'{"a":', b" 2}"])
    assert json.loads(path.read_text()) == {"a": 2}
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert temps(tmp_path) == []


def test_a_full_disk_is_one_clear_error_and_the_old_file_stays(tmp_path, monkeypatch):
    with full_disk(tmp_path, monkeypatch) as disk:
        path = disk.root / "registry.toml"
        if disk.real:
            statefile.atomic_write(path, "old = 1\n")
            disk.fill()
        else:
            path.write_text("old = 1\n")
        with pytest.raises(StateFileError) as e:
            statefile.atomic_write(path, "new = 2\n" * 100_000, what="user registry")
        msg = str(e.value)
        assert msg.startswith(f"cannot write the user registry {path}: no space left")
        assert "\n" not in msg
        assert path.read_text() == "old = 1\n"
        assert temps(disk.root) == []
        with pytest.raises(StateFileError, match="no space left"):
            statefile.check_writable(disk.root / "home", what="qualification results")


def _dead_pid() -> int:
    p = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    p.start()
    p.join()
    return p.pid


def test_leftovers_of_killed_writers_are_cleaned_and_live_ones_kept(tmp_path):
    dead = tmp_path / f".s.session.{_dead_pid()}.0123abcd.tmp"
    live = tmp_path / f".s.session.{os.getpid()}.89abcdef.tmp"
    legacy_old = tmp_path / ".s.abc123.tmp"  # an older edgespec's name: no process id
    legacy_new = tmp_path / ".t.def456.tmp"
    keep = tmp_path / "s.session"
    for p in (dead, live, legacy_old, legacy_new, keep):
        p.write_bytes(b"x" * 100)
    hours_ago = time.time() - 2 * 3600
    os.utime(legacy_old, (hours_ago, hours_ago))
    assert sorted(p.name for p in statefile.clean_temps(tmp_path)) == sorted(
        [dead.name, legacy_old.name])
    assert live.exists() and legacy_new.exists() and keep.exists()


def _bump(home: str, n: int) -> None:
    os.environ["EDGESPEC_HOME"] = home
    from edgespec.registry.store import _atomic_write_text, _model_lock

    path = os.path.join(home, "counter.json")
    for _ in range(n):
        with _model_lock("qualification", lambda _m: None):
            try:
                with open(path) as f:
                    count = json.load(f)["count"]
            except FileNotFoundError:
                count = 0
            time.sleep(0.001)  # widen the window a lost update would need
            _atomic_write_text(path, json.dumps({"count": count + 1}))


def test_concurrent_writers_under_the_lock_lose_no_update(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_bump, args=(str(tmp_path), 25)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert json.loads((tmp_path / "counter.json").read_text()) == {"count": 100}
    assert temps(tmp_path) == []
