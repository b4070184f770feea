"""The FastAPI app: OpenAI-compatible routes over a :class:`~edgespec.serving.Scheduler`
per model, the models held in a :class:`~edgespec.serving.ModelPool`.

    app = create_app(scheduler, engine, ServerSettings(served_model="qwen-1.5b"))  # one model
    app = create_pool_app(pool, ServerSettings(served_model="qwen-1.5b"))          # several

A request names its model; the pool loads it on its first request (unloading idle ones to
make room) and keeps it loaded while its scheduler holds the request.

The routes live beside this module, one group each: generation (chat and completions,
``n > 1`` in choices, the event relay in relay, the body in body) and info (models,
health, metrics); auth holds the API-key middleware, errors the error shape.
"""
from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware

from .._version import __version__
from ..errors import EdgespecError
from ..serving import ModelPool
from . import auth, generation, info
from .errors import install_handlers
from .metrics import ServerMetrics
from .settings import ServerSettings


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
    app.add_middleware(auth.Middleware, api_key=settings.api_key, metrics=metrics)
    if settings.cors_origins:  # outermost: a preflight carries no key and gets its answer
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                           expose_headers=["Retry-After"], max_age=600)
    install_handlers(app, on_error=metrics.reject)
    generation.register(app, pool, settings, metrics)
    info.register(app, pool, settings, metrics, started)
    return app
