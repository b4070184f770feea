"""Speculation control: before each step, which proposer drafts and how many tokens.

    settings.py    ControlSettings, StepView, Decision, Outcome, ControlRecord, the protocol
    acceptance.py  how likely draft tokens are to be accepted (AcceptanceModel, ControlMemory)
    guard.py       GoodputGuard: engine-wide check that speculation pays, per slice
    adaptive.py    AdaptiveController: best expected goodput on the measured cost curve
    fixed.py       FixedController: the configured length, every step

The engine (and :func:`edgespec.lab.replay.generations.replay`, the same protocol offline) calls:

    ctl = make_controller(settings, {"ngram": False, "suffix": False, "draft": True},
                          calibration=cal, guard=engine_guard)
    d = ctl.decide(StepView(generated=n, remaining=max_tokens - n,
                            candidates={"ngram": ..., "suffix": ...}))  # free proposers' drafts
    ...                           # cut the candidate to d.k (or propose(d.k)), verify
    ctl.observe(Outcome(d.proposer, drafted, accepted, draft_s, verify_s, tokens=appended))
    for rec in ctl.drain_events(): yield Control(request_id, *rec)

Conventions. ``Decision.k`` counts *draft tokens* (0 = a plain step). The cost
curve (:mod:`edgespec.calibration`) counts *tokens in the batch*, so verifying
k drafts is a (k + 1)-token pass costing ``cal.cost(k + 1)``.
"""
from __future__ import annotations

from typing import Mapping

from ..calibration.curve import Calibration
from .acceptance import AcceptanceModel, ControlMemory, Feature, expected_tokens, token_features
from .adaptive import AdaptiveController
from .fixed import FixedController
from .guard import GoodputGuard, GuardEstimate
from .settings import (PLAIN_STEP, ControlRecord, ControlSettings, Controller, Decision, Outcome,
                       StepView, reproducible, truncate)


def make_controller(settings: ControlSettings, proposers: Mapping[str, bool],
                    calibration: Calibration | None = None, guard: GoodputGuard | None = None,
                    slice_: str = "default", token_seconds: Mapping[str, float] | None = None,
                    memory: ControlMemory | None = None, *,
                    deterministic: bool = False) -> Controller:
    """The controller a request gets: fixed (``adaptive=False``) or adaptive over ``proposers``.

    ``proposers`` maps each proposer the request may use to whether it is costly. In
    fixed mode ``settings.proposer`` (or the first of ``proposers``) drafts
    ``settings.max_draft`` tokens every step; an empty ``proposers`` means the plain
    path. ``guard`` and ``memory`` are the engine's, shared by its requests;
    ``token_seconds`` gives costly proposers' seconds per drafted token when known.
    ``deterministic`` (:func:`reproducible`): the adaptive controller decides on the request
    and the setup only, never on wall-clock times or other requests.
    """
    settings.validate()
    if not proposers:
        return FixedController(None, 1)
    if not settings.adaptive:
        name = settings.proposer or next(iter(proposers))
        return FixedController(name, settings.max_draft)
    return AdaptiveController(proposers, calibration, settings, guard, slice_, token_seconds, memory,
                              deterministic=deterministic)


__all__ = [
    "AcceptanceModel", "AdaptiveController", "ControlMemory", "ControlRecord", "ControlSettings",
    "Controller", "Decision", "Feature", "FixedController", "GoodputGuard", "GuardEstimate",
    "Outcome", "PLAIN_STEP", "StepView", "expected_tokens", "make_controller", "reproducible",
    "token_features",
    "truncate",
]
