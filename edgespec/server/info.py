"""The information routes: ``GET /v1/models`` (and one model), ``/health``, ``/metrics``."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from ..serving import ModelPool
from .errors import APIError
from .metrics import CONTENT_TYPE, ServerMetrics
from .settings import ServerSettings


def register(app: FastAPI, pool: ModelPool, settings: ServerSettings, metrics: ServerMetrics,
             started: int) -> None:
    """Add the information routes to ``app``; ``started`` is the models' ``created`` time."""

    # response_model=None: the routes answer plain dicts, which FastAPI writes as they are
    @app.get("/v1/models", response_model=None)
    @app.get("/models", response_model=None)  # llama-server answers both
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": model_list(pool, started)}

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def model(model_id: str) -> dict[str, Any]:
        for entry in model_list(pool, started):
            if entry["id"] == model_id:
                return entry
        raise APIError(404, f"no model {model_id!r} (GET /v1/models lists them)",
                       param="model", code="model_not_found")

    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any]:
        load = pool.load()
        return {"status": "ok", "model": settings.served_model, "queued": load.queued,
                "running": load.running, "slots": load.slots, "max_queue": load.max_queue,
                "models": {m.name: m.state for m in pool.entries()}}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def model_list(pool: ModelPool, started: int) -> list[dict[str, Any]]:
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
