"""The generation routes, ``POST /v1/chat/completions`` and ``/v1/completions``.

A request is parsed strictly (body, schemas), mapped to GenerationParams (mapping),
submitted to its model's scheduler (validation and tokenization on a worker thread: a bad
request is a 4xx before it takes a place in the queue), and answered from the engine's
event stream (relay, responses); ``n > 1`` goes to choices.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from ..api.events import Finished, Step
from ..errors import ContextOverflowError
from ..serving import DONE, ModelDoesNotFitError, ModelNotServedError, ModelPool
from . import body, choices
from .errors import APIError, context_overflow
from .mapping import chat_request, chat_turn, completion_request
from .metrics import ServerMetrics
from .relay import Relay, check_ended, chunks, failure, finished_chunks, watch_disconnect, whole
from .responses import Shape
from .schemas import ChatCompletionRequest, CompletionRequest
from .settings import ServerSettings

#: a request header naming the request's traffic slice (the goodput guard and the canary
#: judge speculation per slice); without it the slice is the endpoint, "/json" added for
#: structured output
SLICE_HEADER = "x-edgespec-slice"
_SLICE_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")


def register(app: FastAPI, pool: ModelPool, settings: ServerSettings,
             metrics: ServerMetrics) -> None:
    """Add the generation routes to ``app``."""
    gen = Generation(pool, settings, metrics)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await body.parsed(ChatCompletionRequest, request, settings)
        async with gen.held(req.model) as held:
            engine = held.engine
            prompt, params = chat_request(req, settings, engine.target.n_vocab)
            # tools, tool_choice, the reasoning split, chat_template_kwargs (edgespec.agents)
            prompt, params, turn = chat_turn(req, prompt, params, engine.target.chat_template(),
                                             settings)
            return await gen.generate(request, held, "chat", req, prompt, params, turn)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await body.parsed(CompletionRequest, request, settings)
        async with gen.held(req.model) as held:
            prompt, params = completion_request(req, settings, held.engine.target.n_vocab)
            return await gen.generate(request, held, "completion", req, prompt, params)


class Generation:
    """What the generation routes share: the pool, the settings, the metrics and the
    traffic slices seen so far."""

    def __init__(self, pool: ModelPool, settings: ServerSettings,
                 metrics: ServerMetrics) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.slices = _Slices(settings.max_slices)

    @asynccontextmanager
    async def held(self, model: str):
        """The request's model, loaded and held until its request is in its scheduler
        (which then keeps the model busy until the request ends)."""
        try:
            held = await run_in_threadpool(self.pool.acquire, model)
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

    def _relay(self) -> Relay:
        return Relay(asyncio.get_running_loop(), self.metrics)

    async def generate(self, request: Request, held, kind: str, req, prompt, params,
                       turn=None):
        engine, scheduler = held.engine, held.scheduler
        identity = engine.identity
        traffic = self.slices.of(request.headers.get(SLICE_HEADER), kind, params)
        if (req.n or 1) > 1:  # parallel sequences sharing the prompt's KV (server/choices.py)
            return await choices.generate(
                request, kind, req, prompt, params, turn, n=req.n, scheduler=scheduler,
                engine=engine, identity=identity, traffic=traffic, new_relay=self._relay)
        relay = self._relay()
        try:
            ticket = await run_in_threadpool(
                lambda: scheduler.submit(prompt, params, on_event=relay, traffic=traffic))
        except ContextOverflowError as e:
            raise context_overflow(kind, e) from None
        shape = Shape(kind, req.model, identity.short, engine.target.token_piece)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            out = turn.output() if turn is not None else None
            return EventSourceResponse(_stream(ticket, relay, shape, include_usage, out,
                                               identity.hash), sep="\n", ping=15)
        fin = await _collect(request, ticket, relay)
        out = turn.output() if turn is not None else None
        return JSONResponse(whole(shape, out, fin, identity.hash))


async def _collect(request: Request, ticket, relay: Relay) -> Finished:
    fin = None
    gone = asyncio.Event()
    watcher = asyncio.create_task(watch_disconnect(request, ticket, gone))
    try:
        while True:
            ev = await relay.queue.get()
            if ev is DONE:
                break
            if isinstance(ev, BaseException):
                raise failure(ev)
            if isinstance(ev, Finished):
                fin = ev
    except asyncio.CancelledError:
        ticket.cancel()
        raise
    finally:
        watcher.cancel()
    check_ended(gone, fin is not None)
    return fin


async def _stream(ticket, relay: Relay, shape: Shape, include_usage: bool, out,
                  identity: str):
    """The SSE stream of one choice; ``out`` is the turn's output parser, or None."""
    complete = False
    sent = ""
    try:
        yield json.dumps(shape.chunk("", first=True, include_usage=include_usage))
        while True:
            ev = await relay.queue.get()
            if ev is DONE:
                break
            if isinstance(ev, BaseException):
                complete = True
                yield json.dumps(failure(ev).body())
                return
            if isinstance(ev, Step) and (ev.text or ev.logprobs):
                sent += ev.text
                for piece in chunks(shape, out, ev.text, ev.logprobs, include_usage):
                    yield json.dumps(piece)
            elif isinstance(ev, Finished):
                for piece in finished_chunks(shape, out, ev, sent, identity, include_usage):
                    yield json.dumps(piece)
                if include_usage:
                    yield json.dumps(shape.usage_chunk(ev))
        complete = True
        yield "[DONE]"
    finally:
        # the client went away (sse-starlette cancels this generator) or the send failed
        if not complete:
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
