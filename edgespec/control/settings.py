"""The controller protocol's vocabulary: what a user sets, what the engine shows before a
step, what the controller decides, and what the engine reports after it.

One protocol, driven the same way by the engine and by :func:`edgespec.lab.replay.generations.replay`:

    view = StepView(generated=n, remaining=max_tokens - n,
                    candidates={name: session.propose(settings.max_draft)   # every FREE
                                for name, session in free_sessions.items()})  # proposer
    d = controller.decide(view)        # Decision(proposer, k, reason, ...)
    draft = view.candidates[d.proposer].tokens[:d.k]   # or a costly proposer's propose(d.k)
    ...                                # one target pass, verification
    controller.observe(Outcome(d.proposer, drafted, accepted, draft_s, verify_s,
                               tokens=appended, confidence=..., match_length=...))
    for rec in controller.drain_events(): ...   # ControlRecord -> events.Control

``observe`` comes right after the step that ``decide`` chose; ``Outcome.tokens`` are the
tokens that step appended (accepted drafts, then the target's own), which is what the
controller scores the unused candidates against.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, NamedTuple, Protocol

from ..api.labels import ControlKind
from ..errors import ensure
from ..proposers.base import Draft

if TYPE_CHECKING:
    from ..api.events import Step


@dataclass(frozen=True)
class ControlSettings:
    """What a user can set (``--max-draft``, ``--no-adapt``, ``--floor``, ...)."""

    adaptive: bool = True
    proposer: str | None = None  # fixed mode: the proposer to use (None = plain path)
    #: the most tokens one pass drafts: adaptive control never drafts more (15 drafts = a
    #: 16-token verify pass); fixed control drafts this many every step (--max-draft)
    max_draft: int = 15
    min_draft: int = 1  # adaptive: never draft fewer (a shorter best choice means a plain step)
    floor: float | None = None  # min verified acceptance; None = min(0.6, break-even + 0.1)
    floor_window: int = 32  # verified positions the floor looks at
    floor_min: int = 16  # positions needed before the floor judges on the mean
    # ... and before that, from floor_early positions on, it judges when the rate's upper
    # Wilson bound at floor_z is below it: a request whose first drafts are mostly rejected
    # stops drafting after 6 verified positions instead of 16. Measured by replay on open
    # Spec-Bench prompts (docs/benchmarks.md, 2026-12-06): the math prompt, which paid for
    # 16 positions of 2-3-token misses, went 0.958 -> 0.976 of plain; no other prompt moved
    floor_early: int = 6
    floor_z: float = 1.28  # one-sided 90%
    window: int = 16  # about this many recent drafts (used or shadow-scored) drive the estimates
    margin: float = 0.08  # a draft must beat a plain step's goodput by this fraction
    # adaptive: a draft grows only while its extra tokens pay for the extra pass time at
    # the shorter draft's goodput with this fraction to spare. The extra rows cost for
    # certain; the extra tokens rest on deep positions' estimates, verified least often.
    # Measured on open Spec-Bench prompts (docs/benchmarks.md, 2026-12-05): 6-token drafts
    # predicted to emit 6.5 tokens emitted 3.1, where 3-token ones emitted 2.6
    extend_margin: float = 0.25
    # adaptive: a proposer drafts at most max(ramp, 2 x the longest run of its tokens that
    # matched so far in this request, verified or shadow-scored); 0 = no ramp. A request's
    # first few steps give the acceptance model little evidence and its deep positions
    # over-promise; on a steep cost curve a 15-token draft rejected at its first token costs
    # 5 plain steps, so draft length is earned by runs actually seen (3, 6, 12, ...; 3
    # keeps the 4-token pass, which a repacked CPU computes cheaper than a 3-token one)
    ramp: int = 3
    position_calibration: bool = True  # scale deep positions' estimates by their track record
    probe_match: int = 6  # in fallback, a match this long earns a probe
    probe_after: int = 32  # steps without evidence before a blind probe (doubles per failure)
    probe_after_max: int = 512
    probe_draft: int = 2  # drafts in a blind probe
    guard: bool = True
    guard_threshold: float = 1.0  # disable when the lower bound of speedup falls below this
    guard_z: float = 1.645  # one-sided 95%
    guard_window: int = 128  # speculative steps per slice the guard remembers
    guard_min_steps: int = 64  # speculative steps before the guard judges (per-step goodput is noisy)
    guard_probe_every: int = 8  # while disabled, admit one speculative step per this many asks
    # adaptive: also score fixed caps of each free proposer and the plain path on every
    # step (control/policy.py) and follow whichever beats the current one on paired
    # realized goodput by policy_z standard errors over the last policy_window steps
    policy: bool = False  # opt-in until tests/unit/control/test_control.py is revised for it
    policy_window: int = 32
    policy_z: float = 1.0
    policy_min: int = 6  # scored steps before the first switch

    def validate(self) -> "ControlSettings":
        ensure(self.min_draft >= 1, f"min draft length must be >= 1 (got {self.min_draft})")
        ensure(self.max_draft >= self.min_draft,
               f"max draft length ({self.max_draft}) must be >= min draft length ({self.min_draft})")
        ensure(self.floor is None or 0.0 <= self.floor < 1.0,
               f"the acceptance floor must be in [0, 1) (got {self.floor})")
        ensure(self.floor_window >= self.floor_min >= 1,
               "floor window must be >= floor_min >= 1")
        ensure(1 <= self.floor_early <= self.floor_min,
               f"floor_early must be in [1, floor_min] (got {self.floor_early})")
        ensure(self.floor_z >= 0.0, f"floor_z must be >= 0 (got {self.floor_z})")
        ensure(self.window >= 1, f"window must be >= 1 (got {self.window})")
        ensure(self.margin >= 0.0, f"margin must be >= 0 (got {self.margin})")
        ensure(self.extend_margin >= 0.0,
               f"extend margin must be >= 0 (got {self.extend_margin})")
        ensure(self.ramp >= 0, f"ramp must be >= 0 (got {self.ramp})")
        ensure(self.guard_threshold > 0.0,
               f"guard threshold is a speedup ratio and must be > 0 (got {self.guard_threshold})")
        ensure(self.guard_window >= self.guard_min_steps >= 2,
               "guard window must be >= guard_min_steps >= 2")
        ensure(self.guard_probe_every >= 1, "guard_probe_every must be >= 1")
        ensure(self.probe_after >= 1 and self.probe_after_max >= self.probe_after,
               "probe_after must be >= 1 and <= probe_after_max")
        ensure(self.probe_draft >= 1, "probe_draft must be >= 1")
        ensure(self.policy_window >= self.policy_min >= 2,
               "policy window must be >= policy_min >= 2")
        ensure(self.policy_z >= 0.0, f"policy_z must be >= 0 (got {self.policy_z})")
        return self



@dataclass(frozen=True)
class StepView:
    """What the engine knows before a step.

    ``candidates`` holds a draft from every *free* proposer's session, proposed at
    ``max_draft`` (an empty draft: nothing worth drafting here). Costly proposers (a
    draft model) are absent: they propose only once chosen, at the decided length.
    """

    generated: int = 0  # tokens emitted so far in this request
    remaining: int | None = None  # tokens still allowed (max_tokens - generated); None = no limit
    candidates: Mapping[str, Draft] = field(default_factory=dict)
    # other sequences in the same pass (continuous batching): the rows they add and the
    # tokens they are expected to emit; a draft's price is the pass's growth past them
    batch_rows: int = 0
    batch_tokens: float = 0.0

    def draft_for(self, decision: "Decision") -> Draft | None:
        """The chosen candidate cut to ``decision.k`` tokens; None for a plain step or a
        proposer without a candidate (a costly one: ask its session for ``k`` tokens)."""
        if decision.proposer is None or decision.plain:
            return None
        cand = self.candidates.get(decision.proposer)
        return None if cand is None else truncate(cand, decision.k)


def reproducible(greedy: bool, seed: int | None, exact: bool) -> bool:
    """Whether a request's passes must not depend on wall-clock time or other requests: a
    greedy or seeded one promises its text whenever it is sent alone, and outside
    ``--exact`` a pass of another shape may compute a near-tie the other way. Exact mode's
    passes compute the same logits whatever their shape (within its probed cap), so there
    the controller may follow the load; so may an unseeded sample, which promises nothing."""
    return (greedy or seed is not None) and not exact


def truncate(draft: Draft, k: int) -> Draft:
    """The first ``k`` tokens of a draft, with their distributions and confidences."""
    return draft.head(k)


@dataclass(frozen=True)
class Decision:
    """The controller's answer; for a free proposer the engine cuts its candidate to ``k``,
    a costly one is asked to ``propose(k)``."""

    proposer: str | None  # None = plain step
    k: int  # draft tokens to propose / keep (0 for a plain step)
    reason: str
    expected_tokens: float = 1.0  # E(k), the model's forecast of tokens this step emits
    expected_speedup: float = 1.0  # forecast goodput relative to a plain step

    @property
    def plain(self) -> bool:
        return self.proposer is None or self.k <= 0


#: the plain step (no proposer drafts)
PLAIN_STEP = Decision(None, 0, "plain path")


@dataclass(frozen=True)
class Outcome:
    """What a step did, for :meth:`Controller.observe`."""

    proposer: str | None
    drafted: int
    accepted: int
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # the target pass (plain or verify)
    # every token the step appended (accepted drafts then the target's own): lets the
    # controller score drafts it did not use; () turns shadow scoring off
    tokens: tuple[int, ...] = ()
    confidence: tuple[float, ...] | None = None  # the draft's per-token confidence, if any
    match_length: int = 0
    batch_rows: int = 0  # rows of the whole pass when other sequences shared it (0: alone)

    @classmethod
    def of(cls, step: Step, draft: Draft | None = None) -> "Outcome":
        """From an :class:`edgespec.api.events.Step` and the draft that was verified."""
        return cls(proposer=step.proposer, drafted=step.drafted, accepted=step.accepted,
                   draft_seconds=step.draft_seconds, verify_seconds=step.verify_seconds,
                   tokens=tuple(step.tokens),
                   confidence=draft.confidence if draft is not None else None,
                   match_length=draft.match_length if draft is not None else 0)


class ControlRecord(NamedTuple):
    """A mode change, field order matching ``events.Control`` after its request_id."""

    kind: ControlKind
    reason: str
    k: int | None = None  # the draft length it changed to, where it says
    proposer: str | None = None


class Controller(Protocol):
    """Asked before every step, told right after it (see the module docstring)."""

    def decide(self, view: StepView) -> Decision: ...

    def observe(self, outcome: Outcome) -> None: ...

    def drain_events(self) -> list[ControlRecord]: ...

