"""The names every layer shares: the plain path, the planner's choice, how requests end.

They live here, below everything, so that reading a label never imports the module that
acts on it (the proposer registry, the planner, the controllers).
"""
from __future__ import annotations

from typing import Literal

#: the plain path's proposer name; every module that needs it imports it from here
PLAIN = "none"
#: "let the planner decide" (a proposer, a draft, a kernel configuration)
AUTO = "auto"

#: why a request ended (``events.Finished.stop_reason``)
StopReason = Literal["eos", "stop", "length", "context", "cancelled", "grammar"]
STOP_REASONS: tuple[str, ...] = ("eos", "stop", "length", "context", "cancelled", "grammar")

#: a ``events.Control`` event's kind: an open set of names that controllers, the canary and
#: the scheduler emit (fallback, probe, recover, guard_off, guard_on, guarded, canary[_ARM],
#: load_yield, load_resume, ...); adapters show unknown kinds as they are
ControlKind = str
