"""The engine's old calling convention, kept only until engine.py drives the protocol
directly (StepView -> decide -> observe(Outcome)); delete with its last caller."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ..calibration import Calibration
from ..proposers.base import Draft
from .acceptance import ControlMemory
from .guard import GoodputGuard
from .settings import Controller, ControlSettings, Outcome, StepView


class EngineAdapter:
    """Drives a :class:`Controller` from the engine loop as it stands (``engine._serve``).

    The loop calls ``decide(req) -> (proposer, k)`` before a step,
    ``observe(proposer, drafted, accepted, draft_s, verify_s, draft)`` after it and
    ``drain_events() -> [(kind, reason)]`` after deciding. The adapter builds the
    :class:`StepView` from the request (for a free proposer it asks the session for a
    ``max_draft`` candidate first, which the engine's own ``propose(k)`` then repeats
    as a prefix), and holds each outcome back until the next ``decide``, when
    ``req.generated`` shows which tokens the step really emitted.
    """

    def __init__(self, controller: Controller, proposer: str, costly: bool, max_draft: int) -> None:
        self.controller = controller
        self.proposer = proposer
        self.costly = costly
        self.max_draft = max_draft
        self._held: Outcome | None = None
        self._mark = 0

    def decide(self, req) -> tuple[str | None, int]:
        self._flush(req)
        remaining = req.params.max_tokens - len(req.generated)
        cands = {}
        if not self.costly and req.session is not None:
            cands[self.proposer] = req.session.propose(min(self.max_draft, max(remaining - 1, 0)))
        d = self.controller.decide(StepView(generated=len(req.generated), remaining=remaining,
                                            candidates=cands))
        return (None, 0) if d.plain else (d.proposer, d.k)

    def observe(self, proposer: str | None, drafted: int, accepted: int, draft_seconds: float,
                verify_seconds: float, draft: Draft | None = None) -> None:
        self._held = Outcome(proposer=proposer if drafted else None, drafted=drafted,
                             accepted=accepted, draft_seconds=draft_seconds,
                             verify_seconds=verify_seconds,
                             confidence=draft.confidence if draft is not None else None,
                             match_length=draft.match_length if draft is not None else 0)

    def _flush(self, req) -> None:
        n = len(req.generated)
        if self._held is not None:
            emitted = tuple(req.generated[self._mark:n])
            self.controller.observe(replace(self._held, tokens=emitted))
            self._held = None
        self._mark = n

    def drain_events(self) -> list[tuple[str, str]]:
        return [(r.kind, r.reason) for r in self.controller.drain_events()]


def engine_controller_factory(settings: ControlSettings, calibration: Calibration | None = None,
                              guard: GoodputGuard | None = None, slice_: str = "default",
                              memory: ControlMemory | None = None):
    """``controller_factory(proposer_name, proposers)`` for :class:`edgespec.engine.Engine`.

    One adaptive (or fixed) controller per request over the request's proposer;
    the guard and the memory are shared by every request of the engine.
    """
    settings.validate()

    def factory(proposer_name: str, proposers: Mapping) -> EngineAdapter:
        p = proposers[proposer_name]
        costly = bool(getattr(p, "costly", False))
        per_token = getattr(p, "seconds_per_token", 0.0) or None
        from . import make_controller
        ctl = make_controller(replace(settings, proposer=proposer_name), {proposer_name: costly},
                              calibration, guard, slice_,
                              {proposer_name: per_token} if per_token else None, memory)
        return EngineAdapter(ctl, proposer_name, costly, settings.max_draft)

    return factory

