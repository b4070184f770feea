"""The canary's part of a request's events (edgespec.control.guard decides the routes): why
a request runs the plain path or probes, and what its decode rate changed for its slice."""
from __future__ import annotations

from ..api.events import Control, Event, Finished, RequestStarted
from ..api.labels import canary_kind
from ..control import GoodputGuard
from ..control.guard import Route
from ..loop.state import Request


def canary_events(guard: GoodputGuard, ev: Event, req: Request, route: Route,
                  traffic: str) -> list[Event]:
    """A Control event saying why the request runs the plain path (or probes) after
    RequestStarted, and at Finished its decode rate reported to the guard, with a Control
    event when that switches speculation off or on for the slice."""
    out: list[Event] = []
    if isinstance(ev, Finished):
        rec = guard.observe_request(traffic, route, ev.stats.decode_tokens,
                                    ev.stats.decode_seconds)
        if rec is not None:
            req.stats.observe_control(rec.kind)
            out.append(Control(req.id, rec.kind, rec.reason, proposer=rec.proposer))
    out.append(ev)
    if isinstance(ev, RequestStarted) and route.reason:
        kind = canary_kind(route.arm)
        req.stats.observe_control(kind)
        out.append(Control(req.id, kind, route.reason, proposer=route.label))
    return out
