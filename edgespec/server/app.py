"""The FastAPI app: OpenAI-compatible routes over a :class:`~edgespec.serving.Scheduler`
per model, the models held in a :class:`~edgespec.serving.ModelPool`.

    app = create_app(scheduler, engine, ServerSettings(served_model="qwen-1.5b"))  # one model
    app = create_pool_app(pool, ServerSettings(served_model="qwen-1.5b"))          # several

A request names its model; the pool loads it on its first request (unloading idle ones to
make room) and keeps it loaded while its scheduler holds the request.

A request is parsed strictly (schemas), mapped to GenerationParams (mapping), submitted to
the scheduler (validation and tokenization on a worker thread: a bad request is a 4xx
before it takes a place in the queue), and answered from the engine's event stream
(responses). Events arrive on the scheduler thread and cross to the event loop through
``call_soon_threadsafe``; a client that goes away cancels its ticket, which frees its
sequence at the next step.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from .._version import __version__
from ..errors import ContextOverflowError, EdgespecError
from ..api.events import Finished, Step
from ..serving import DONE, ModelDoesNotFitError, ModelNotServedError, ModelPool
from . import auth, choices
from .choices import _chunks
from .errors import APIError, from_edgespec, install_handlers
from .mapping import chat_request, chat_turn, completion_request
from .metrics import CONTENT_TYPE, ServerMetrics
from .responses import Shape
from .schemas import ChatCompletionRequest, CompletionRequest, parse_request
from .settings import ServerSettings

log = logging.getLogger("edgespec.server")

#: a request header naming the request's traffic slice (the goodput guard and the canary
#: judge speculation per slice); without it the slice is the endpoint, "/json" added for
#: structured output
SLICE_HEADER = "x-edgespec-slice"
_SLICE_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")

#: how often a non-streaming request checks that its client is still there
_DISCONNECT_POLL_SECONDS = 0.5
#: an oversized body is read and dropped up to this size before the 413 (see _body)
_DISCARD_BYTES = 16 * 1024 * 1024


def create_app(scheduler, engine, settings: ServerSettings) -> FastAPI:
    """One preloaded model; the caller releases the engine after the app has stopped."""
    return create_pool_app(ModelPool.single(settings.served_model, settings.aliases, engine,
                                            scheduler), settings)


def create_pool_app(pool: ModelPool, settings: ServerSettings) -> FastAPI:
    settings = settings.validate()
    first = next(pool.entries())
    if first.engine is None:
        raise EdgespecError(f"the server's first model {first.name!r} must be loaded before "
                            "the app is made (its identity names the build)")
    metrics = ServerMetrics(pool, first.engine, settings.served_model)
    started = int(time.time())
    first.engine.identity  # computed once (Engine caches it), before a request needs it

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn has stopped accepting and waited for open requests; whatever is still
        # admitted finishes before the engines are released
        await run_in_threadpool(pool.close)

    app = FastAPI(title="edgespec", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics
    app.add_middleware(_Auth, api_key=settings.api_key, metrics=metrics)
    if settings.cors_origins:  # outermost: a preflight carries no key and gets its answer
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                           expose_headers=["Retry-After"], max_age=600)
    install_handlers(app, on_error=metrics.reject)

    # --- generation -----------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = _parse(ChatCompletionRequest, await _body(request, settings), settings, request)
        async with _held(req.model) as held:
            engine = held.engine
            prompt, params = chat_request(req, settings, engine.target.n_vocab)
            # tools, tool_choice, the reasoning split, chat_template_kwargs (edgespec.agents)
            prompt, params, turn = chat_turn(req, prompt, params, engine.target.chat_template(),
                                             settings)
            return await _generate(request, held, "chat", req, prompt, params, turn)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = _parse(CompletionRequest, await _body(request, settings), settings, request)
        async with _held(req.model) as held:
            prompt, params = completion_request(req, settings, held.engine.target.n_vocab)
            return await _generate(request, held, "completion", req, prompt, params)

    @asynccontextmanager
    async def _held(model: str):
        """The request's model, loaded and held until its request is in its scheduler
        (which then keeps the model busy until the request ends)."""
        try:
            held = await run_in_threadpool(pool.acquire, model)
        except ModelNotServedError as e:
            raise APIError(404, str(e), type="invalid_request_error", param="model",
                           code="model_not_found") from None
        except ModelDoesNotFitError as e:
            raise APIError(503, str(e), type="server_error", param="model",
                           code="insufficient_memory", headers={"Retry-After": "5"}) from None
        try:
            yield held
        finally:
            held.release()

    slices = _Slices(settings.max_slices)

    async def _generate(request: Request, held, kind: str, req, prompt, params, turn=None):
        engine, scheduler = held.engine, held.scheduler
        identity = engine.identity
        traffic = slices.of(request.headers.get(SLICE_HEADER), kind, params)
        if (req.n or 1) > 1:  # parallel sequences sharing the prompt's KV (server/choices.py)
            return await choices.generate(
                request, kind, req, prompt, params, turn, n=req.n, scheduler=scheduler,
                engine=engine, identity=identity, traffic=traffic, watch=_watch_disconnect,
                new_bridge=lambda: _Bridge(asyncio.get_running_loop(), metrics),
                failure=_failure)
        bridge = _Bridge(asyncio.get_running_loop(), metrics)
        try:
            ticket = await run_in_threadpool(
                lambda: scheduler.submit(prompt, params, on_event=bridge, traffic=traffic))
        except ContextOverflowError as e:
            raise APIError(400, str(e), param="messages" if kind == "chat" else "prompt",
                           code="context_length_exceeded") from None
        shape = Shape(kind, req.model, identity.short, engine.target.token_piece)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return EventSourceResponse(_stream(ticket, bridge, shape, include_usage, turn,
                                               identity), sep="\n", ping=15)
        fin = await _collect(request, ticket, bridge)
        if turn is None:
            return JSONResponse(shape.whole(fin, identity.hash))
        out = turn.output()
        out.feed(fin.text)
        final = out.finish(fin.stop_reason)
        return JSONResponse(shape.whole(fin, identity.hash, out.message(), final.finish_reason))

    async def _collect(request: Request, ticket, bridge: "_Bridge") -> Finished:
        fin = None
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(request, ticket, gone))
        try:
            while True:
                ev = await bridge.queue.get()
                if ev is DONE:
                    break
                if isinstance(ev, BaseException):
                    raise _failure(ev)
                if isinstance(ev, Finished):
                    fin = ev
        except asyncio.CancelledError:
            ticket.cancel()
            raise
        finally:
            watcher.cancel()
        if gone.is_set():
            raise APIError(499, "the client closed the connection", code="client_closed")
        if fin is None:  # dropped while queued (the scheduler closed without draining)
            raise APIError(503, "the request was dropped before it ran; retry",
                           type="server_error", code="dropped")
        return fin

    async def _stream(ticket, bridge: "_Bridge", shape: Shape, include_usage: bool, turn=None,
                      identity=None):
        complete = False
        sent = ""
        out = turn.output() if turn is not None else None
        try:
            yield json.dumps(shape.chunk("", first=True, include_usage=include_usage))
            while True:
                ev = await bridge.queue.get()
                if ev is DONE:
                    break
                if isinstance(ev, BaseException):
                    complete = True
                    yield json.dumps(_failure(ev).body())
                    return
                if isinstance(ev, Step) and (ev.text or ev.logprobs):
                    sent += ev.text
                    for body in _chunks(shape, out, ev.text, ev.logprobs, include_usage):
                        yield json.dumps(body)
                elif isinstance(ev, Finished):
                    if ev.text.startswith(sent) and len(ev.text) > len(sent):
                        # text the assembler held back (a possible stop string) and released
                        for body in _chunks(shape, out, ev.text[len(sent):], (), include_usage):
                            yield json.dumps(body)
                    reason = None
                    if out is not None:  # what the turn's parsers still held
                        final = out.finish(ev.stop_reason)
                        for delta in final.deltas:
                            yield json.dumps(shape.chunk("", delta=delta,
                                                         include_usage=include_usage))
                        reason = final.finish_reason
                    yield json.dumps(shape.final_chunk(ev, identity.hash, include_usage, reason))
                    if include_usage:
                        yield json.dumps(shape.usage_chunk(ev))
            complete = True
            yield "[DONE]"
        finally:
            # the client went away (sse-starlette cancels this generator) or the send failed
            if not complete:
                ticket.cancel()

    # --- information ----------------------------------------------------------------------
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": _model_list(pool, started)}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        for entry in _model_list(pool, started):
            if entry["id"] == model_id:
                return entry
        raise APIError(404, f"no model {model_id!r} (GET /v1/models lists them)",
                       param="model", code="model_not_found")

    @app.get("/health")
    async def health():
        load = pool.load()
        return {"status": "ok", "model": settings.served_model, "queued": load.queued,
                "running": load.running, "slots": load.slots, "max_queue": load.max_queue,
                "models": {m.name: m.state for m in pool.entries()}}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


async def _watch_disconnect(request: Request, ticket, gone: asyncio.Event) -> None:
    """Cancel ``ticket`` once the client of a non-streaming request has gone away (a
    streaming one learns it from sse-starlette, which cancels its generator)."""
    while not await request.is_disconnected():
        await asyncio.sleep(_DISCONNECT_POLL_SECONDS)
    gone.set()
    ticket.cancel()


class _Slices:
    """Traffic slice names: checked, and bounded in number (the guard keeps state per
    slice, so a client must not be able to grow it without limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def of(self, header: str | None, kind: str, params) -> str:
        if header is None:
            structured = params.json_mode or params.json_schema is not None
            return kind + ("/json" if structured else "")
        if not _SLICE_NAME.fullmatch(header):
            raise APIError(400, f"the {SLICE_HEADER} header must be 1-64 characters of "
                                "letters, digits and _.:/-", param=SLICE_HEADER,
                           code="invalid_value")
        with self._lock:
            if header not in self.seen and len(self.seen) >= self.limit:
                raise APIError(400, f"this server already tracks {self.limit} traffic slices; "
                                    "reuse one of the names you sent before",
                               param=SLICE_HEADER, code="too_many_slices")
            self.seen.add(header)
        return header


class _Bridge:
    """on_event for one request: runs on the scheduler thread, feeds the metrics and hands
    each event to the request's asyncio queue without blocking."""

    def __init__(self, loop: asyncio.AbstractEventLoop, metrics: ServerMetrics) -> None:
        self.loop = loop
        self.metrics = metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started = time.monotonic()
        self.ended = False  # a Finished or an error arrived

    def __call__(self, event) -> None:
        try:
            if event is DONE and not self.ended:
                # the scheduler ends a request cancelled while queued with DONE alone: it
                # is still a request that ended cancelled (back-to-back disconnects queue)
                self.metrics.observe_cancelled_queued(time.monotonic() - self.started)
            self.ended = self.ended or isinstance(event, (Finished, BaseException))
            self.metrics.observe(event)
        except Exception:  # metrics must never break a request
            log.exception("metrics failed on %r", type(event).__name__)
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server stopped, nobody is listening
            pass


def _failure(exc: BaseException) -> APIError:
    if isinstance(exc, EdgespecError):
        return from_edgespec(exc)
    log.error("request failed on the scheduler thread", exc_info=exc)
    return APIError(500, f"internal error ({type(exc).__name__}); the server keeps serving, "
                         "please report this with the server log", type="server_error", code="internal_error")


def _parse(model, body: str, settings: ServerSettings, request: Request):
    """The validated request; unknown fields are dropped and named in one log line (or,
    with --strict, refused by parse_request)."""
    req, ignored = parse_request(model, body, strict=settings.strict)
    if ignored:
        log.warning("%s: ignored unknown request fields: %s (edgespec serve --strict refuses "
                    "them)", request.url.path, ", ".join(ignored))
    return req


async def _body(request: Request, settings: ServerSettings) -> str:
    """The request body as text: at most settings.max_body_bytes, valid UTF-8, complete
    within settings.read_timeout (a client that stops sending gets a 408 and is closed)."""
    try:
        return await asyncio.wait_for(_read_body(request, settings), settings.read_timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {settings.read_timeout:g} "
                            "s (the server's --timeout-read); send it at once",
                       code="request_timeout", headers={"Connection": "close"}) from None


async def _read_body(request: Request, settings: ServerSettings) -> str:
    limit = settings.max_body_bytes
    too_big = APIError(413, f"the request body exceeds {limit} bytes; send a shorter prompt",
                       code="request_too_large")
    length = request.headers.get("content-length", "")
    declared = int(length) if length.isdigit() else None
    if declared is not None and declared > _DISCARD_BYTES:
        raise too_big
    chunks, size = [], 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            # read the rest without keeping it, so the client (still sending) sees the 413
            # instead of a reset connection
            async for rest in stream:
                size += len(rest)
                if size > _DISCARD_BYTES:
                    break
            raise too_big
        chunks.append(chunk)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 (byte 0x{data[e.start]:02x} "
                            f"at offset {e.start}); send UTF-8 encoded JSON",
                       code="invalid_encoding") from None


def _model_list(pool: ModelPool, started: int) -> list[dict]:
    """Exactly the models this server answers for, each with its state (loaded, loading,
    unloaded: loaded on its first request)."""
    out = []
    for m in pool.entries():
        engine = m.engine
        entry = {"id": m.name, "object": "model", "created": started, "owned_by": "edgespec",
                 "loaded": engine is not None, "state": m.state, "aliases": list(m.aliases),
                 "identity": None}
        if engine is not None:
            identity = engine.identity
            cfg = engine.config
            entry["identity"] = identity.hash
            entry["edgespec"] = {"target": engine.target_name, "draft": engine.draft_name,
                                 "proposer": engine.default_proposer,
                                 "exact": bool(engine.exact), "parallel": cfg.parallel,
                                 "n_ctx": cfg.n_ctx, "identity_record": identity.to_dict()}
        else:
            entry["edgespec"] = {"memory_bytes": m.memory or None, "loads": m.loads,
                                 "last_error": m.error}
        out.append(entry)
    return out


class _Auth:
    """Pure ASGI middleware (streaming responses and disconnects pass through untouched)."""

    def __init__(self, app, api_key: str | None, metrics: ServerMetrics) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.api_key is not None:
            header = dict(scope.get("headers") or ()).get(b"authorization", b"")
            try:
                auth.check(self.api_key, scope.get("path", ""), header.decode("latin-1"))
            except APIError as e:
                self.metrics.reject(e.status, e.code)
                await e.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
