"""The names every layer shares: the plain path, the planner's choice, how requests end,
what the controllers say.

They live here, below everything, so that reading a label never imports the module that
acts on it (the proposer registry, the planner, the controllers). The values are part of
the event stream's JSON, the server's output and its metrics labels: they are Literal
types over the very strings written there, so a typo is a type error and nothing that
reads them changes.
"""
from __future__ import annotations

from typing import Literal, Union, get_args

#: the plain path's proposer name; every module that needs it imports it from here
PLAIN = "none"
#: "let the planner decide" (a proposer, a draft, a kernel configuration)
AUTO = "auto"

#: why a request ended (``events.Finished.stop_reason``)
StopReason = Literal["eos", "stop", "length", "context", "cancelled", "grammar"]
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)
#: a request's stop reason while it may still run: "" until it ends
MaybeStopReason = Union[StopReason, Literal[""]]

#: which arm of the request-level canary a request runs (``control.guard.Route.arm``):
#: "speculative" (as asked), "canary" (plain, the slice's baseline), "probe" (speculating
#: while the slice is off), "held" (plain, the slice is off), "direct" (no canary)
RouteArm = Literal["speculative", "canary", "probe", "held", "direct"]

#: a ``events.Control`` event's kind:
#:   fallback, probe, recover, policy  the adaptive controller (control/adaptive.py)
#:   guard_off, guard_on, guarded      the per-step goodput guard (control/guard.py)
#:   canary_off, canary_on             the request-level canary switching a slice
#:   canary, canary_probe, canary_held a request routed by the canary (:func:`canary_kind`)
#:   load_yield, load_resume           the scheduler holding drafts back under load
ControlKind = Literal["fallback", "probe", "recover", "policy", "guard_off", "guard_on",
                      "guarded", "canary_off", "canary_on", "canary", "canary_probe",
                      "canary_held", "load_yield", "load_resume"]
CONTROL_KINDS: tuple[ControlKind, ...] = get_args(ControlKind)

_CANARY_KINDS: dict[RouteArm, ControlKind] = {
    "canary": "canary", "probe": "canary_probe", "held": "canary_held"}


def canary_kind(arm: RouteArm) -> ControlKind:
    """The Control kind announcing a request the canary routed to ``arm`` (only the
    canary, probe and held arms are announced: the others run as asked)."""
    return _CANARY_KINDS[arm]
