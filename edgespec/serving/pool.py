"""Several models behind one server: each loaded on its first request into an engine and
a scheduler of its own, unloaded when idle past a keep-alive or when another model needs
its memory (least recently used first).

    pool = ModelPool([PoolModel("qwen-1.5b", config_a, memory=a), PoolModel("smollm2", ...)],
                     budget=plan.budget_host, keep_alive=300.0, load=build)
    with pool.acquire("smollm2") as slot:      # loads it (and unloads others) if needed
        ticket = slot.scheduler.submit(...)    # the scheduler now holds the request
    pool.close()

A model is *busy* while a caller holds it (between ``acquire`` and the end of the ``with``)
or while its scheduler has a request queued or running; only idle models are unloaded,
so a request never loses its engine. What a model needs is the planner's estimate of its
resident memory (weights, KV cache, compute buffers), counted against ``budget``: a model
that cannot fit even with every idle model unloaded is refused, naming what is busy.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ..errors import EdgespecError, InvalidInputError
from .tickets import QueueLoad
from ..runtime.device import fmt_size

if TYPE_CHECKING:
    from ..config.engine_config import EngineConfig
    from ..engine.engine import Engine
    from .scheduler import Scheduler

#: builds a model: its engine and the scheduler over it
Loader = Callable[["PoolModel"], "tuple[Engine, Scheduler]"]
#: releases a model's engine and scheduler
Unloader = Callable[["Engine", "Scheduler | None"], None]


class ModelNotServedError(InvalidInputError):
    """A request named a model this server does not serve."""


class ModelDoesNotFitError(EdgespecError):
    """A model cannot be loaded within the memory budget while others are busy."""


@dataclass
class PoolModel:
    """One model the server offers: its id (and aliases), how to build it, what it needs."""

    name: str
    config: EngineConfig | None = None  # what the loader builds (None: preloaded only)
    memory: int = 0  # resident bytes the planner estimates while loaded
    aliases: tuple[str, ...] = ()
    engine: Engine | None = None
    scheduler: Scheduler | None = None
    state: str = "unloaded"  # unloaded | loading | loaded
    last_used: float = 0.0
    holders: int = 0  # callers between acquire and release
    loads: int = 0
    error: str | None = None  # why the last load failed
    # seconds idle before unloading, set by a request (Ollama's keep_alive): None: the
    # pool's keep-alive; negative: until another model needs the memory
    keep_alive: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def answers(self, model_id: str) -> bool:
        return model_id == self.name or model_id in self.aliases

    def busy(self) -> bool:
        if self.holders:
            return True
        if self.scheduler is None:
            return False
        load = self.scheduler.load()
        return bool(load.running or load.queued)


class ModelPool:
    """See the module docstring. ``load(model) -> (engine, scheduler)`` builds a model;
    ``unload(engine, scheduler)`` releases one (default: drain the scheduler, close the
    engine). ``keep_alive`` seconds idle before a model is unloaded (None: never)."""

    def __init__(self, models: Sequence[PoolModel], *, budget: int | None = None,
                 keep_alive: float | None = None,
                 load: Loader | None = None, unload: Unloader | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not models:
            raise InvalidInputError("a server needs at least one model")
        seen: dict[str, str] = {}
        for m in models:
            for n in (m.name, *m.aliases):
                if n in seen and seen[n] != m.name:
                    raise InvalidInputError(f"the model id {n!r} names both {seen[n]!r} and "
                                            f"{m.name!r}; pass distinct --model ids")
                seen[n] = m.name
        if keep_alive is not None and keep_alive < 0:
            raise InvalidInputError(f"keep-alive must be >= 0 seconds (got {keep_alive})")
        self.models = list(models)
        self.budget = budget
        self.keep_alive = keep_alive
        self._load = load
        self._unload = unload or _close
        self._clock = clock
        self._lock = threading.Lock()  # the set of loaded models and their memory
        self._closed = False
        self._reaper: threading.Thread | None = None
        self._wake = threading.Event()
        for m in self.models:
            if m.engine is not None:
                m.state, m.last_used = "loaded", clock()

    @classmethod
    def single(cls, name: str, aliases: Sequence[str], engine: Engine,
               scheduler: Scheduler) -> "ModelPool":
        """One preloaded model, never unloaded (``edgespec serve`` with one target); closing
        the pool drains its scheduler and leaves the engine to its owner."""
        return cls([PoolModel(name, aliases=tuple(aliases), engine=engine, scheduler=scheduler)],
                   unload=lambda _engine, sched: sched.close(drain=True) if sched else None)

    # --- requests ----------------------------------------------------------------------
    def find(self, model_id: str) -> PoolModel:
        for m in self.models:
            if m.answers(model_id):
                return m
        raise ModelNotServedError(
            f"the model {model_id!r} is not served here; this server serves "
            f"{', '.join(repr(m.name) for m in self.models)} (GET /v1/models)")

    def acquire(self, model_id: str) -> Held:
        """The model, loaded (blocking while it loads) and held until the returned
        context exits; raises ModelNotServedError / ModelDoesNotFitError."""
        m = self.find(model_id)
        with self._lock:
            if self._closed:
                raise EdgespecError("the server is shutting down")
            m.holders += 1
            m.last_used = self._clock()
        try:
            with m._lock:  # one load per model; others wait for it
                if m.engine is None:
                    self._make_room(m)
                    m.state, m.error = "loading", None
                    assert self._load is not None  # _make_room refused a pool without one
                    try:
                        m.engine, m.scheduler = self._load(m)
                    except BaseException as e:
                        m.state, m.error = "unloaded", str(e)
                        raise
                    m.state, m.loads = "loaded", m.loads + 1
        except BaseException:
            self._drop(m)
            raise
        self._start_reaper()
        return Held(self, m)

    def _drop(self, m: PoolModel) -> None:
        with self._lock:
            m.holders -= 1
            m.last_used = self._clock()
        self._wake.set()

    def _make_room(self, m: PoolModel) -> None:
        """Unload idle models, least recently used first, until ``m`` fits the budget."""
        if self._load is None:
            raise EdgespecError(f"the model {m.name!r} is not loaded and this server cannot "
                                "load models")
        if self.budget is None:
            return
        while True:
            with self._lock:
                loaded = [o for o in self.models if o is not m and o.engine is not None]
                used = sum(o.memory for o in loaded)
                if used + m.memory <= self.budget:
                    return
                idle = sorted((o for o in loaded if not o.busy()), key=lambda o: o.last_used)
                if not idle:
                    busy = ", ".join(f"{o.name} ({fmt_size(o.memory)})" for o in loaded)
                    raise ModelDoesNotFitError(
                        f"the model {m.name!r} needs {fmt_size(m.memory)} and the memory "
                        f"budget is {fmt_size(self.budget)}; {busy} would have to be unloaded "
                        "but " + ("it is" if len(loaded) == 1 else "they are") + " serving "
                        "requests; retry when they finish, or raise --budget")
                victim = idle[0]
            self._evict(victim)

    def _evict(self, m: PoolModel) -> bool:
        """Unload ``m`` if it is still loaded and idle (under its own lock)."""
        with m._lock:
            with self._lock:
                if m.engine is None or m.busy():
                    return False
                engine, scheduler = m.engine, m.scheduler
                m.engine = m.scheduler = None
                m.state = "unloaded"
            self._unload(engine, scheduler)
            return True

    # --- idle models -----------------------------------------------------------------
    def reap(self) -> list[str]:
        """Unload every model idle for longer than the keep-alive; returns their names."""
        now = self._clock()
        out = []
        for m in self.models:
            keep = self.keep_alive if m.keep_alive is None else m.keep_alive
            if keep is None or keep < 0:
                continue
            if m.engine is None or m.config is None:
                continue  # not loaded, or preloaded with no way to load it again
            if m.busy():
                m.last_used = now  # a request is running: idle time starts after it
                continue
            if now - m.last_used >= keep and self._evict(m):
                out.append(m.name)
        return out

    def keep(self, model_id: str, seconds: float | None) -> None:
        """``model_id``'s own keep-alive from now on (a request's, e.g. Ollama's
        ``keep_alive``): seconds idle before it is unloaded; negative: until another model
        needs the memory; None: the pool's again."""
        m = self.find(model_id)
        m.keep_alive = seconds
        if seconds is not None and seconds >= 0:
            self._start_reaper(force=True)
            self._wake.set()

    def unload(self, model_id: str, wait: float = 0.0) -> bool:
        """Unload ``model_id`` now if it is idle and can be loaded again (waiting up to
        ``wait`` seconds for its last request to leave its scheduler); False otherwise."""
        m = self.find(model_id)
        if m.config is None or self._load is None:
            return False  # preloaded with no way to load it again
        deadline = self._clock() + wait
        while True:
            if m.engine is None or self._evict(m):
                return True
            if self._clock() >= deadline:
                return False
            time.sleep(0.05)

    def _start_reaper(self, force: bool = False) -> None:
        if (self.keep_alive is None and not force) or self._reaper is not None:
            return
        with self._lock:
            if self._reaper is not None or self._closed:
                return
            self._reaper = threading.Thread(target=self._reap_loop, name="edgespec-pool-reaper",
                                            daemon=True)
            self._reaper.start()

    def _reap_loop(self) -> None:
        while not self._closed:
            keeps = [k for k in [self.keep_alive, *(m.keep_alive for m in self.models)]
                     if k is not None and k >= 0]
            period = min(max(min(keeps, default=5.0) / 4, 0.05), 5.0)
            self._wake.wait(period)
            self._wake.clear()
            if not self._closed:
                self.reap()

    # --- information -------------------------------------------------------------------
    def load(self) -> QueueLoad:
        q = r = s = mq = 0
        for m in self.models:
            sch = m.scheduler
            if sch is not None:
                x = sch.load()
                q, r, s, mq = q + x.queued, r + x.running, s + x.slots, mq + x.max_queue
        return QueueLoad(q, r, s, mq)

    def entries(self) -> Iterator[PoolModel]:
        return iter(list(self.models))

    def close(self) -> None:
        """Close every scheduler (draining what is admitted) and release every engine."""
        with self._lock:
            self._closed = True
        self._wake.set()
        for m in self.models:
            with m._lock:
                engine, scheduler = m.engine, m.scheduler
                m.engine = m.scheduler = None
                m.state = "unloaded"
            if engine is not None:
                self._unload(engine, scheduler)


class Held:
    """A held model: ``engine`` and ``scheduler`` stay loaded until the context exits;
    ``name`` is the id it was asked by (protocol.Core sets it: an alias stays the alias)."""

    def __init__(self, pool: ModelPool, model: PoolModel) -> None:
        # acquire() loaded the model, and holding it keeps it loaded
        assert model.engine is not None and model.scheduler is not None
        self.pool, self.model = pool, model
        self.engine: Engine = model.engine
        self.scheduler: Scheduler = model.scheduler
        self.name = model.name
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.pool._drop(self.model)

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _close(engine: Engine | None, scheduler: Scheduler | None) -> None:
    try:
        if scheduler is not None:
            scheduler.close(drain=True)
    finally:
        if engine is not None:
            engine.close()
