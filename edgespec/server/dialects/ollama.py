"""Ollama's native API over the protocol core: ``POST /api/chat``, ``/api/generate``,
``/api/show``, ``GET /api/tags``, ``/api/ps``, ``/api/version``, and ``GET``/``HEAD /``
answering "Ollama is running" on the Ollama listener only (``edgespec serve --ollama-port``;
the main port's ``/`` is the web page's).

Answers stream as NDJSON (one JSON object per line) unless ``stream: false``; errors are
Ollama's ``{"error": "..."}`` with the status (also as the last line of a stream that
fails mid-way). A client that goes away mid-stream cancels its request, which frees its
sequence. The wire shapes are :mod:`.ollama_wire`; the model listings :mod:`.ollama_models`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request  # module level: FastAPI reads the annotations
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ...protocol.core import Core, Running
from ...protocol.errors import ProtocolError
from ...protocol.events import ChoiceDone, ReasoningDelta, TextDelta
from ...protocol.request import CoreRequest
from ...serving import ModelNotServedError, ModelPool
from ..body import read
from ..settings import ServerSettings
from . import ollama_models
from .fields import load_object
from .refusal import counted, refusing, to_protocol
from .ollama_wire import (API_VERSION, OllamaRequest, Renderer, Timing, check_num_ctx,
                          error_body, parse_chat, parse_generate)

log = logging.getLogger("edgespec.server")

NDJSON = "application/x-ndjson"
#: parse_chat or parse_generate: (body, max_tokens_limit, reasoning default) -> request
Parser = Callable[[dict[str, Any], int, str], OllamaRequest]
RUNNING = "Ollama is running"


def register(app: FastAPI, core: Core, settings: ServerSettings) -> None:
    """Ollama's routes on ``app``; ``app.state.ollama_ports`` holds the ports whose ``/``
    answers as Ollama does (``edgespec serve --ollama-port`` adds its port once bound)."""
    app.state.ollama_ports = set()
    app.add_middleware(OllamaRoot, ports=app.state.ollama_ports)

    @refusing(refusal)
    async def generation(request: Request, parse: Parser) -> Response:
        t0 = time.monotonic()
        body = load_object(await read(request, settings))
        req: OllamaRequest = parse(body, settings.max_tokens_limit,
                                   getattr(settings, "reasoning_format", "auto"))
        name = resolve(core, req.model)
        if req.core is None:  # load, or with keep_alive 0 unload
            return JSONResponse(await lifecycle(core, req, name))
        timing = Timing()
        loaded_before, t_hold = _loaded(core, name), time.monotonic()
        async with core.held(name) as held:
            timing.load = 0.0 if loaded_before else time.monotonic() - t_hold
            check_num_ctx(req.num_ctx, held.engine.config.n_ctx, req.model)
            run = await core.start(request, _named(req.core, name))
            out = Renderer(req.endpoint, req.model, held.engine.target.token_piece)
        if req.stream:
            return StreamingResponse(_ndjson(run, out, timing, t0, core, req, name),
                                     media_type=NDJSON)
        done = (await run.collect())[0]
        timing.total = time.monotonic() - t0
        await after(core, req, name)
        return JSONResponse(out.final(done, timing, whole=True))

    @app.post("/api/chat")
    async def chat(request: Request) -> Response:
        return await generation(request, parse_chat)

    @app.post("/api/generate")
    async def generate(request: Request) -> Response:
        return await generation(request, parse_generate)

    @app.get("/api/tags")
    @refusing(refusal)
    async def tags(request: Request) -> Response:
        return JSONResponse({"models": await asyncio.to_thread(
            ollama_models.tags, core.pool)})

    @app.get("/api/ps")
    @refusing(refusal)
    async def ps(request: Request) -> Response:
        return JSONResponse({"models": await asyncio.to_thread(
            ollama_models.running, core.pool)})

    @app.post("/api/show")
    @refusing(refusal)
    async def show(request: Request) -> Response:
        body = load_object(await read(request, settings))
        asked = body.get("model", body.get("name"))
        if not isinstance(asked, str) or not asked:
            raise ProtocolError(400, "model is required: the name of a model (GET "
                                     "/api/tags lists them)", param="model")
        entry = core.pool.find(resolve(core, asked))
        return JSONResponse(await asyncio.to_thread(ollama_models.show, entry))

    @app.get("/api/version")
    async def version() -> Response:
        return JSONResponse({"version": API_VERSION})


def resolve(core: Core, name: str) -> str:
    """The served model a client's name reaches: Ollama names carry a tag (``name:latest``
    is ``name``); unknown is a 404 in Ollama's words."""
    for candidate in (name, name[:-len(":latest")] if name.endswith(":latest") else None):
        if candidate is None:
            continue
        try:
            found: str = core.resolve(candidate)
            return found
        except ModelNotServedError:
            continue
    served = ", ".join(repr(m.name) for m in core.pool.entries())
    raise ProtocolError(404, f"model {name!r} not found; this server serves {served} (GET "
                             "/api/tags)", kind="not_found", param="model",
                        code="model_not_found")


def _named(req: CoreRequest, name: str) -> CoreRequest:
    return replace(req, model=name)  # the served id the client's name reached


def _loaded(core: Core, name: str) -> bool:
    try:
        return core.pool.find(name).engine is not None
    except ModelNotServedError:
        return False


async def lifecycle(core: Core, req: OllamaRequest, name: str) -> dict[str, Any]:
    """An empty prompt or no messages: load the model, or (keep_alive 0) unload it."""
    out = Renderer(req.endpoint, req.model)
    if req.keep_alive is not None and req.keep_alive == 0:
        await asyncio.to_thread(_unload, core.pool, name)
        return out.lifecycle("unload")
    async with core.held(name):
        pass
    _keep(core.pool, name, req.keep_alive)
    return out.lifecycle("load")


async def after(core: Core, req: OllamaRequest, name: str) -> None:
    """The request's keep_alive, applied once it has finished."""
    if req.keep_alive is not None and req.keep_alive == 0:
        await asyncio.to_thread(_unload, core.pool, name)
    else:
        _keep(core.pool, name, req.keep_alive)


def _unload(pool: ModelPool, name: str) -> None:
    unload = getattr(pool, "unload", None)
    if unload is None or not unload(name, wait=5.0):
        log.info("keep_alive 0: %s stays loaded (it is busy or cannot be loaded again)", name)


def _keep(pool: ModelPool, name: str, seconds: float | None) -> None:
    keep = getattr(pool, "keep", None)
    if seconds is not None and keep is not None:
        keep(name, seconds)


async def _ndjson(run: Running, out: Renderer, timing: Timing, t0: float, core: Core,
                  req: OllamaRequest, name: str) -> AsyncIterator[bytes]:
    complete = False
    try:
        done: ChoiceDone | None = None
        async for ev in run:
            if isinstance(ev, TextDelta) and (ev.text or ev.logprobs):
                yield _line(out.delta(ev.text, lps=ev.logprobs))
            elif isinstance(ev, ReasoningDelta) and ev.text:
                yield _line(out.delta(thinking=ev.text))
            elif isinstance(ev, ChoiceDone):
                done = ev
        complete = True
        if done is not None:
            if done.tool_calls and out.endpoint == "chat":
                yield _line(out.calls(done.tool_calls))
            timing.total = time.monotonic() - t0
            yield _line(out.final(done, timing, whole=False))
        await after(core, req, name)
    except Exception as e:  # the answer cannot continue: Ollama ends the stream with an error
        complete = True
        yield _line(error_body(to_protocol(e).message))
    finally:
        if not complete:  # the client went away (Starlette cancels this generator)
            run.cancel()


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


def refusal(request: Request, e: BaseException) -> Response:
    """Ollama's error answer: ``{"error": "..."}`` with the status, counted."""
    err = counted(request, e)
    return JSONResponse(error_body(err.message), status_code=err.status, headers=err.headers)


class OllamaRoot:
    """``GET``/``HEAD /`` on an Ollama port: "Ollama is running" (clients probe it to find
    an Ollama server); on every other port the request goes on to the app (the web page)."""

    def __init__(self, app: ASGIApp, ports: set[int]) -> None:
        self.app = app
        self.ports = ports

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == "/" \
                and scope.get("method") in ("GET", "HEAD") \
                and (scope.get("server") or (None, None))[1] in self.ports:
            body = b"" if scope["method"] == "HEAD" else RUNNING.encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(RUNNING)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
