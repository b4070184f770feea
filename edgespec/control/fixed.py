"""The fixed controller: the configured proposer at the configured length, every step."""
from __future__ import annotations

from ..errors import InvalidInputError
from .settings import PLAIN_STEP, ControlRecord, Decision, Outcome, StepView


class FixedController:
    """Always the configured proposer at the configured length (``--max-draft N --no-adapt``)."""

    def __init__(self, proposer: str | None, k: int) -> None:
        if proposer is not None and k < 1:
            raise InvalidInputError(f"draft length must be >= 1 (got {k})")
        self.proposer = proposer
        self.k = k

    def decide(self, view: StepView) -> Decision:
        if self.proposer is None:
            return PLAIN_STEP
        k = self.k
        if view.remaining is not None:
            k = min(k, view.remaining - 1)  # the target's own token fills the last slot
        if k < 1:
            return Decision(None, 0, "one token left")
        return Decision(self.proposer, k, f"fixed draft length {self.k}")

    def observe(self, outcome: Outcome) -> None:
        pass  # nothing adapts

    def drain_events(self) -> list[ControlRecord]:
        return []

