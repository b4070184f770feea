"""``GET /v1/edgespec/status``: what a client needs to judge speculation on this server, in
one JSON object: each model's state, load and proposers, and the plain path's decode rate
on this machine (the calibrated step time), against which the web page reports a speedup.

The plain rate comes from the calibration the engine loaded with its adaptive controller
(measured once per device and model, cached on disk: ``edgespec plan`` shows the same
figure). An engine built without one (``--no-adaptive``) reports ``plain: null``: measuring
a curve here would stall the model's requests for seconds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._version import __version__
from ...api.labels import PLAIN
from ...errors import EdgespecError
from ...serving import ModelPool, PoolModel
from ..settings import ServerSettings

if TYPE_CHECKING:
    from ...engine.engine import Engine


def status(pool: ModelPool, settings: ServerSettings) -> dict[str, Any]:
    load = pool.load()
    return {
        "object": "edgespec.status",
        "version": __version__,
        "default_model": settings.served_model,
        "max_tokens_limit": settings.max_tokens_limit,
        # what a chat request may choose for itself (else its model's own): its proposer
        # (the chat route's `proposer` field); exactness is the server's (--exact)
        "choices": {"proposer": True, "exact": False},
        "load": {"queued": load.queued, "running": load.running, "slots": load.slots,
                 "max_queue": load.max_queue},
        "models": [_model(m) for m in pool.entries()],
    }


def _model(m: PoolModel) -> dict[str, Any]:
    engine, scheduler = m.engine, m.scheduler
    out: dict[str, Any] = {"id": m.name, "aliases": list(m.aliases), "state": m.state,
                           "loaded": engine is not None, "loads": m.loads,
                           "last_error": m.error, "memory_bytes": m.memory or None}
    if engine is None:
        return out
    cfg = engine.config
    out.update(target=engine.target_name, draft=engine.draft_name,
               proposer=engine.default_proposer, proposers=[PLAIN, *engine.proposers],
               exact=bool(engine.exact), parallel=cfg.parallel, n_ctx=engine.ctx.n_ctx,
               plain=plain_rate(engine))
    if scheduler is not None:
        x = scheduler.load()
        out["load"] = {"queued": x.queued, "running": x.running, "slots": x.slots,
                       "max_queue": x.max_queue}
    return out


def plain_rate(engine: Engine) -> dict[str, Any] | None:
    """The plain path's single-sequence decode rate from the engine's loaded calibration,
    or None when it loaded none (see the module docstring)."""
    if not engine.control.adaptive:
        return None
    try:
        cal = engine.calibration()  # loaded with the engine: returns at once
    except EdgespecError:
        return None
    if not cal.step_seconds or cal.step_seconds <= 0:
        return None
    return {"step_seconds": cal.step_seconds, "tokens_per_second": 1.0 / cal.step_seconds,
            "source": cal.source, "measured_at": cal.measured_at or None}
