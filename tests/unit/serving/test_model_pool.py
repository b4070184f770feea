"""ModelPool on fakes: which model loads, which unloads, and when (no llama.cpp)."""
from __future__ import annotations

import threading
import time

import pytest

from edgespec.errors import InvalidInputError
from edgespec.serving import ModelDoesNotFitError, ModelNotServedError, ModelPool, PoolModel
from edgespec.serving.tickets import QueueLoad

MB = 1 << 20


class FakeScheduler:
    def __init__(self) -> None:
        self.running = 0
        self.closed = False

    def load(self) -> QueueLoad:
        return QueueLoad(0, self.running, 1, 4)

    def close(self, drain: bool = True) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def pool(budget=None, keep_alive=None, sizes=(300, 500, 200), loader=None, clock=None):
    log: list[tuple[str, str]] = []

    def load(m):
        log.append(("load", m.name))
        return object(), FakeScheduler()

    models = [PoolModel(f"m{i}", config=object(), memory=s * MB) for i, s in enumerate(sizes)]
    p = ModelPool(models, budget=None if budget is None else budget * MB, keep_alive=keep_alive,
                  load=loader or load, unload=lambda e, s: log.append(("unload", _name(models, s))),
                  clock=clock or Clock())
    return p, models, log


def _name(models, scheduler):
    return getattr(scheduler, "name", "?")  # set by acquire() below


def acquire(p, name):
    held = p.acquire(name)
    held.scheduler.name = name  # so the unload log names it
    held.release()
    return held


def test_a_model_loads_once_on_its_first_request():
    p, models, log = pool()
    acquire(p, "m1")
    acquire(p, "m1")
    assert log == [("load", "m1")] and models[1].state == "loaded" and models[1].loads == 1
    assert models[0].state == "unloaded"


def test_the_least_recently_used_idle_model_makes_room():
    clock = Clock()
    p, models, log = pool(budget=850, clock=clock)
    acquire(p, "m0")  # 300
    clock.t = 1
    acquire(p, "m2")  # 200: 500 in all
    clock.t = 2
    acquire(p, "m0")  # m0 used again: m2 is now the least recent
    clock.t = 3
    acquire(p, "m1")  # 500 more than fits beside both: m2 goes first, then 800 fits
    assert log[-2:] == [("unload", "m2"), ("load", "m1")]
    assert [m.state for m in models] == ["loaded", "loaded", "unloaded"]


def test_a_busy_model_is_never_unloaded_and_the_refusal_names_it():
    p, models, log = pool(budget=600)
    held = p.acquire("m1")  # 500, held: a request between acquire and its scheduler
    with pytest.raises(ModelDoesNotFitError, match="m1 .*serving requests"):
        p.acquire("m0")
    assert models[0].holders == 0 and models[0].state == "unloaded"
    held.release()
    models[1].scheduler.running = 1  # now its scheduler runs a request: still busy
    with pytest.raises(ModelDoesNotFitError):
        p.acquire("m0")
    models[1].scheduler.running = 0
    models[1].scheduler.name = "m1"
    acquire(p, "m0")
    assert models[1].state == "unloaded" and models[0].state == "loaded"


def test_idle_models_unload_after_the_keep_alive_and_running_ones_do_not():
    clock = Clock()
    p, models, log = pool(keep_alive=10.0, clock=clock)
    acquire(p, "m0")
    acquire(p, "m1")
    models[1].scheduler.running = 1
    clock.t = 11
    assert p.reap() == ["m0"]  # m1 is running a request: its idle time starts after it
    models[1].scheduler.running = 0
    clock.t = 20
    assert p.reap() == []
    clock.t = 22
    assert p.reap() == ["m1"]
    assert [m.state for m in models[:2]] == ["unloaded", "unloaded"]


def test_the_reaper_thread_unloads_without_anyone_asking():
    p, models, log = pool(keep_alive=0.1, clock=time.monotonic)
    acquire(p, "m0")
    deadline = time.monotonic() + 5
    while models[0].state != "unloaded" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert models[0].state == "unloaded"
    p.close()


def test_concurrent_first_requests_load_a_model_once():
    started = threading.Event()
    loads = []

    def slow(m):
        loads.append(m.name)
        started.set()
        time.sleep(0.2)
        return object(), FakeScheduler()
    p, models, _ = pool(loader=slow)
    threads = [threading.Thread(target=lambda: p.acquire("m2").release()) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert loads == ["m2"] and models[2].holders == 0


def test_a_failed_load_leaves_the_model_unloaded_with_its_reason():
    def broken(m):
        raise OSError("disk gone")
    p, models, _ = pool(loader=broken)
    with pytest.raises(OSError):
        p.acquire("m0")
    assert models[0].state == "unloaded" and models[0].error == "disk gone"
    assert models[0].holders == 0


def test_names_are_checked():
    p, models, _ = pool()
    with pytest.raises(ModelNotServedError, match="'m0', 'm1', 'm2'"):
        p.find("nope")
    with pytest.raises(InvalidInputError, match="names both"):
        ModelPool([PoolModel("a"), PoolModel("b", aliases=("a",))])
    with pytest.raises(InvalidInputError):
        ModelPool([])
    with pytest.raises(InvalidInputError, match="keep-alive"):
        ModelPool([PoolModel("a")], keep_alive=-1)


def test_a_single_preloaded_model_is_never_unloaded_and_its_engine_stays_with_its_owner():
    sched = FakeScheduler()
    p = ModelPool.single("only", ("alias",), object(), sched)
    held = p.acquire("alias")
    assert held.scheduler is sched
    held.release()
    assert p.reap() == []
    p.close()
    assert sched.closed
