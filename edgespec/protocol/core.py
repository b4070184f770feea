"""Running a :class:`~.request.CoreRequest`: the one mapping onto the engine and the
scheduler under every dialect.

Server side (async)::

    core = Core(pool, settings, metrics)
    run = await core.start(http_request, req)     # validated, submitted: errors raise here
    async for ev in run: ...                      # TextDelta, ..., ChoiceDone per choice
    # or: async for ev in core.stream(http_request, req); dones = await core.complete(...)

A request's model is held while it is validated (tokenized, its turn prepared: on a worker
thread) and submitted; from then on its scheduler keeps the model busy. ``n`` choices run
as parallel sequences sharing the prompt's KV (Scheduler.submit_n); several requests can
run as one (:meth:`Core.start_all`: completions' list of prompts), their choices numbered
one after the other. Leaving the iteration early (the client went away) cancels every
choice, which frees their sequences at the next step.

Without a server (edgespec.apps): :func:`run` is the synchronous twin over one Engine.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence

from ..api.events import Event, Finished, Step
from ..errors import ContextOverflowError, EdgespecError
from ..serving import DONE, Held, ModelDoesNotFitError, ModelNotServedError
from .errors import ProtocolError, context_overflow, from_edgespec, from_failure, not_found
from .events import ChoiceDone, CoreEvent
from .engine_input import EngineInput, engine_input
from .reader import ChoiceReader
from .request import CoreRequest

log = logging.getLogger("edgespec.protocol")

#: a request header naming the request's traffic slice (the goodput guard and the canary
#: judge speculation per slice); without it the slice is the request's kind, "/json" added
#: for structured output
SLICE_HEADER = "x-edgespec-slice"
_SLICE_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
#: how often a non-streaming request checks that its client is still there
_DISCONNECT_POLL_SECONDS = 0.5


class Core:
    """The server's side of every dialect: models held from ``pool``, limits from
    ``settings`` (an edgespec.server ServerSettings: served_model, reasoning_format,
    max_slices, model_alias_any), every engine event fed to ``metrics`` (observe,
    observe_cancelled_queued; None: not counted)."""

    def __init__(self, pool: Any, settings: Any, metrics: Any = None) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.slices = _Slices(getattr(settings, "max_slices", 64))

    # --- models ---------------------------------------------------------------------------
    def resolve(self, model: str | None) -> str:
        """The model id a request reaches: none named, or an unknown one with
        --model-alias-any, is the server's default model (as llama-server answers)."""
        default: str = self.settings.served_model
        if not model:
            return default
        try:
            self.pool.find(model)
        except ModelNotServedError:
            if getattr(self.settings, "model_alias_any", False):
                return default
            raise
        return model

    @asynccontextmanager
    async def held(self, model: str | None) -> AsyncIterator[Held]:
        """The model, loaded and held (``.engine``, ``.scheduler``, ``.name``) until the
        block ends; None: the default model."""
        try:
            name = self.resolve(model)
            held: Held = await asyncio.to_thread(self.pool.acquire, name)
        except ModelNotServedError as e:
            raise not_found(str(e)) from None
        except ModelDoesNotFitError as e:
            raise ProtocolError(503, str(e), kind="server_error", param="model",
                                code="insufficient_memory", headers={"Retry-After": "5"}) from None
        except EdgespecError as e:  # the pool is shutting down
            raise from_edgespec(e) from None
        held.name = name
        try:
            yield held
        finally:
            held.release()

    # --- running --------------------------------------------------------------------------
    async def start(self, http_request: Any, req: CoreRequest,
                    traffic: str | None = None) -> "Running":
        return await self.start_all(http_request, [req], traffic)

    async def start_all(self, http_request: Any, reqs: Sequence[CoreRequest],
                        traffic: str | None = None) -> "Running":
        """Validate and submit ``reqs`` (one model: the first's) as one request whose
        choices are numbered in order (request 0's n choices first). Raises ProtocolError;
        nothing stays queued when one of them is refused."""
        if not reqs:
            raise ProtocolError(400, "the request has no prompt", param="prompt",
                                code="invalid_value")
        first = reqs[0]
        header = http_request.headers.get(SLICE_HEADER) if http_request is not None else None
        async with self.held(first.model) as held:
            engine, scheduler = held.engine, held.scheduler
            inputs = await asyncio.to_thread(self._inputs, engine, reqs, held.name)
            lane = traffic or self.slices.of(header, _kind(first), inputs[0].params)
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
            readers: list[ChoiceReader] = []
            handles: list[Any] = []
            try:
                for k, (req, p) in enumerate(zip(reqs, inputs)):
                    base = len(readers)
                    readers += [ChoiceReader(base + j, p.turn.output() if p.turn else None,
                                             origins=req.origins, prefix=p.prefix, request=k)
                                for j in range(req.n)]
                    relays = [_Relay(loop, queue, base + j, self.metrics) for j in range(req.n)]
                    handles.append(await asyncio.to_thread(
                        _submit, scheduler, p, req, relays, lane))
            except BaseException as e:
                for h in handles:
                    h.cancel()
                if isinstance(e, ContextOverflowError):
                    raise context_overflow(e, first.param_prompt) from None
                if isinstance(e, EdgespecError):
                    raise from_edgespec(e, first.param_prompt) from None
                raise
        model = first.model or held.name
        return Running(queue, readers, handles, http_request, model, engine, first.param_prompt)

    async def stream(self, http_request: Any, req: CoreRequest) -> AsyncIterator[CoreEvent]:
        run = await self.start(http_request, req)
        async for ev in run:
            yield ev

    async def complete(self, http_request: Any, req: CoreRequest) -> list[ChoiceDone]:
        return await (await self.start(http_request, req)).collect()

    def _inputs(self, engine: Any, reqs: Sequence[CoreRequest], name: str) -> list[EngineInput]:
        fmt = getattr(self.settings, "reasoning_format", "auto")
        try:
            return [engine_input(engine, r, name, fmt) for r in reqs]
        except EdgespecError as e:
            raise from_edgespec(e, reqs[0].param_prompt) from None


def _kind(req: CoreRequest) -> str:
    return {"chat": "chat", "prompt": "completion", "fim": "infill"}[req.kind]


def _submit(scheduler: Any, p: EngineInput, req: CoreRequest, relays: list["_Relay"],
            traffic: str) -> Any:
    if req.n == 1:
        return scheduler.submit(p.prompt, p.params, on_event=relays[0], traffic=traffic,
                                proposer=req.proposer)
    try:
        scheduler.check_choices(req.n)
    except EdgespecError as e:
        # fewer sequences than choices (llama-server's default serves n anyway), or a pool
        # split per sequence: the choices run as requests of their own, queued, each
        # reusing the prompt's cached prefix where its sequence holds it
        return _one_by_one(scheduler, p, req, relays, traffic, e)
    return scheduler.submit_n(p.prompt, p.params, req.n,
                              on_event=lambda i, ev: relays[i](ev), traffic=traffic,
                              proposer=req.proposer)


def _one_by_one(scheduler: Any, p: EngineInput, req: CoreRequest, relays: list["_Relay"],
                traffic: str, why: EdgespecError) -> "_Group":
    room = getattr(scheduler, "parallel", 1) + getattr(scheduler, "max_queue", 0)
    if req.n > room:
        raise ProtocolError(400, f"n = {req.n} choices: {why}; they could run one after the "
                                 f"other, but this server holds at most {room} requests "
                                 "(--parallel + --max-queue)", param="n",
                            code="invalid_value")
    seed = p.params.sampling.seed
    group = _Group()
    try:
        for i in range(req.n):
            params = p.params if seed is None or i == 0 else replace(
                p.params, sampling=replace(p.params.sampling, seed=(seed + i) % 2 ** 64))
            group.tickets.append(scheduler.submit(p.prompt, params, on_event=relays[i],
                                                  traffic=traffic, proposer=req.proposer))
    except BaseException:
        group.cancel()
        raise
    return group


class _Group:
    """Choices submitted as requests of their own, cancelled together."""

    def __init__(self) -> None:
        self.tickets: list[Any] = []

    def cancel(self) -> None:
        for t in self.tickets:
            t.cancel()


class _Relay:
    """on_event for one choice: runs on the scheduler thread, feeds the metrics and hands
    each event to the request's asyncio queue as (index, event) without blocking."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: "asyncio.Queue[tuple[int, Any]]",
                 index: int,
                 metrics: Any) -> None:
        self.loop, self.queue, self.index, self.metrics = loop, queue, index, metrics
        # the HTTP request's outcome (server.metrics), read here on the loop, in the request's
        # context: its choices and its route report its end, which is counted once
        self.outcome = metrics.outcome() if hasattr(metrics, "outcome") else None
        self.started = time.monotonic()
        self.ended = False  # a Finished or an error arrived

    def __call__(self, event: Any) -> None:
        if self.metrics is not None:
            try:
                if event is DONE and not self.ended:
                    # a request cancelled while queued ends with DONE alone: it still ended
                    self.metrics.observe_cancelled_queued(time.monotonic() - self.started,
                                                          self.outcome)
                self.metrics.observe(event, self.outcome)
            except Exception:  # metrics must never break a request
                log.exception("metrics failed on %r", type(event).__name__)
        self.ended = self.ended or isinstance(event, (Finished, BaseException))
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, event))
        except RuntimeError:  # the loop is closed: the server stopped, nobody is listening
            pass


class Running:
    """A submitted request: iterate it for its core events (every choice, in the order
    they happened), or :meth:`collect` the ChoiceDone of each. Stopping early cancels it."""

    def __init__(self, queue: "asyncio.Queue[tuple[int, Any]]", readers: list[ChoiceReader],
                 handles: list[Any],
                 http_request: Any, model: str, engine: Any, param: str) -> None:
        self.queue = queue
        self.readers = readers
        self.handles = handles
        self.http_request = http_request
        self.model = model  # as the client named it (or the default model's id)
        self.engine = engine
        self.param = param
        self.gone = asyncio.Event()  # the client went away (collect's watcher)

    @property
    def n(self) -> int:
        return len(self.readers)

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()

    def starts(self) -> list[CoreEvent]:
        """What every choice starts with before the engine speaks (echo's prompt text)."""
        return [e for r in self.readers for e in r.start()]

    async def __aiter__(self) -> AsyncGenerator[CoreEvent, None]:  # aclose(): cancel
        complete = False
        ended = 0
        try:
            for ev in self.starts():
                yield ev
            while ended < self.n:
                i, ev = await self.queue.get()
                if ev is DONE:
                    ended += 1
                elif isinstance(ev, BaseException):
                    complete = True
                    self.cancel()  # one choice failed: the answer cannot be whole
                    raise from_failure(ev, self.param)
                elif isinstance(ev, Step):
                    for out in self.readers[i].step(ev):
                        yield out
                elif isinstance(ev, Finished):
                    for out in self.readers[i].finish(ev):
                        yield out
            complete = True
            if self.gone.is_set():
                raise ProtocolError(499, "the client closed the connection",
                                    code="client_closed")
            if any(r.done is None for r in self.readers):
                raise ProtocolError(503, "the request was dropped before it ran; retry",
                                    kind="server_error", code="dropped")
        finally:
            if not complete:  # the consumer stopped early (the client went away)
                self.cancel()

    async def collect(self) -> list[ChoiceDone]:
        """Every choice's ChoiceDone, watching the client: gone, the request is cancelled
        (and a 499 raised)."""
        watcher = None
        if self.http_request is not None:
            watcher = asyncio.create_task(self._watch())
        try:
            async for _ in self:
                pass
        finally:
            if watcher is not None:
                watcher.cancel()
        return [r.done for r in self.readers if r.done is not None]

    async def _watch(self) -> None:
        while not await self.http_request.is_disconnected():
            await asyncio.sleep(_DISCONNECT_POLL_SECONDS)
        self.gone.set()
        self.cancel()


class _Slices:
    """Traffic slice names: checked, and bounded in number (the guard keeps state per
    slice, so a client must not be able to grow it without limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def of(self, header: str | None, kind: str, params: Any) -> str:
        if header is None:
            structured = params.json_mode or params.json_schema is not None
            return kind + ("/json" if structured else "")
        if not _SLICE_NAME.fullmatch(header):
            raise ProtocolError(400, f"the {SLICE_HEADER} header must be 1-64 characters of "
                                     "letters, digits and _.:/-", param=SLICE_HEADER,
                                code="invalid_value")
        with self._lock:
            if header not in self.seen and len(self.seen) >= self.limit:
                raise ProtocolError(400, f"this server already tracks {self.limit} traffic "
                                         "slices; reuse one of the names you sent before",
                                    param=SLICE_HEADER, code="too_many_slices")
            self.seen.add(header)
        return header


# --- without a server ---------------------------------------------------------------------
def run(engine: Any, req: CoreRequest, *, model_name: str | None = None,
        reasoning_format: str = "auto") -> Iterator[CoreEvent]:
    """The synchronous twin of :meth:`Core.stream` over one Engine (edgespec.apps): the
    request's ``n`` choices run one after the other (choice i seeded ``seed + i``, as the
    scheduler seeds them). Errors raise ProtocolError."""
    name = model_name or getattr(engine, "target_name", None) or "the model"
    try:
        p = engine_input(engine, req, name, reasoning_format)
    except EdgespecError as e:
        raise from_edgespec(e, req.param_prompt) from None
    yield from execute(engine, req, p)


def execute(engine: Any, req: CoreRequest, p: EngineInput, *,
            wrap: Callable[[Iterator[Event]], Iterator[Event]] | None = None
            ) -> Iterator[CoreEvent]:
    """:func:`run` once ``req`` is lowered to its engine input (edgespec.apps does that first, so that a bad request
    raises before a stream is handed out). ``wrap`` sees the engine's own events on their
    way in (edgespec.apps.aio watches them to cancel the request it runs). Closing this
    generator closes the engine's stream at once, which frees the engine."""
    seed = p.params.sampling.seed
    options: dict[str, Any] = {"proposer": req.proposer}
    if req.logits_processor is not None:
        options["logits_processor"] = req.logits_processor
    for i in range(req.n):
        params = p.params if seed is None or i == 0 else replace(
            p.params, sampling=replace(p.params.sampling, seed=(seed + i) % 2 ** 64))
        reader = ChoiceReader(i, p.turn.output() if p.turn else None, origins=req.origins,
                              prefix=p.prefix)
        yield from reader.start()
        stream = engine.stream(p.prompt, params, **options)
        events = wrap(stream) if wrap is not None else stream
        try:
            for ev in events:
                if isinstance(ev, Step):
                    yield from reader.step(ev)
                elif isinstance(ev, Finished):
                    yield from reader.finish(ev)
        except EdgespecError as e:
            raise from_edgespec(e, req.param_prompt) from None
        finally:
            for it in (events, stream):
                close = getattr(it, "close", None)
                if close is not None:
                    close()


__all__ = ["Core", "Running", "SLICE_HEADER", "execute", "run"]
