"""The FastAPI app: OpenAI-compatible routes over a :class:`~edgespec.serving.Scheduler`
per model, the models held in a :class:`~edgespec.serving.ModelPool`.

    app = create_app(scheduler, engine, ServerSettings(served_model="qwen-1.5b"))  # one model
    app = create_pool_app(pool, ServerSettings(served_model="qwen-1.5b"))          # several

A request names its model; the pool loads it on its first request (unloading idle ones to
make room) and keeps it loaded while its scheduler holds the request.

Every generation route is a dialect (edgespec.server.dialects: OpenAI chat and
completions, ...) over one :class:`~edgespec.protocol.Core`, which holds the models and runs
requests on their schedulers; info has the models, health and metrics routes; body reads a
request's body within the limits, auth holds the API-key middleware, errors the OpenAI
error shape.
"""
from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, AsyncIterator

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from .._version import __version__
from ..errors import EdgespecError
from ..serving import ModelPool, Scheduler
from ..protocol import Core
from . import auth, guard, info, web
from .dialects import openai_chat, openai_completions
from .dialects import anthropic, responses
from .dialects import llamacpp, ollama
from .dialects import embeddings
from .errors import install_handlers
from .metrics import Accounting, ServerMetrics
from .settings import ServerSettings

if TYPE_CHECKING:
    from ..engine.engine import Engine


def create_app(scheduler: Scheduler, engine: Engine, settings: ServerSettings) -> FastAPI:
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
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn has stopped accepting and waited for open requests; whatever is still
        # admitted finishes before the engines are released
        await run_in_threadpool(pool.close)

    app = FastAPI(title="edgespec", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics
    app.add_middleware(auth.Middleware, api_key=settings.api_key, metrics=metrics)
    if settings.cors_origins:  # outermost: a preflight carries no key and gets its answer
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                           expose_headers=["Retry-After"], max_age=600)
    # outermost: Host, Origin and Content-Type are checked before CORS, the key or a route
    app.add_middleware(guard.Middleware, hosts=None if settings.allowed_hosts is None else
                       guard.HostPolicy.for_bind(settings.allowed_hosts),
                       cors_origins=settings.cors_origins, on_refusal=metrics.reject)
    app.add_middleware(_Preflight, cors=bool(settings.cors_origins))
    # outermost of all: each request's outcome counted once (server.metrics)
    app.add_middleware(Accounting, metrics=metrics)
    install_handlers(app, on_error=metrics.reject)
    core = Core(pool, settings, metrics)
    app.state.core = core
    openai_chat.register(app, core, settings)
    openai_completions.register(app, core, settings)
    anthropic.register(app, core, settings)
    responses.register(app, core, settings)
    ollama.register(app, core, settings)  # /api/*; / on the --ollama-port listener
    llamacpp.register(app, core, settings)  # /completion, /infill, /tokenize, /props...
    embeddings.register(app, core, settings)  # /v1/embeddings, /api/embed, /api/embeddings
    info.register(app, pool, settings, metrics, started)
    web.register(app, pool, settings)  # GET / (unless --no-web) and /v1/edgespec/status
    return app


class _Preflight:
    """A CORS preflight (OPTIONS with Access-Control-Request-Method) that no CORS
    middleware answers (no --cors-origin) gets a 204 naming the methods, and no
    Access-Control-Allow-Origin: the browser then refuses the call itself, instead of the
    server answering 405 to a request it does serve."""

    def __init__(self, app: ASGIApp, cors: bool) -> None:
        self.app, self.cors = app, cors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "OPTIONS" and not self.cors:
            headers = dict(scope.get("headers") or ())
            if b"access-control-request-method" in headers:
                await send({"type": "http.response.start", "status": 204,
                            "headers": [(b"allow", b"GET, POST, OPTIONS"),
                                        (b"vary", b"Origin")]})
                await send({"type": "http.response.body", "body": b""})
                return
        await self.app(scope, receive, send)
