"""The typed event stream an engine request yields.

Every adapter (CLI, TUI, benchmark, desktop app) consumes only these. They are
plain frozen dataclasses so they can cross threads and be logged as JSON.

Token origins: a token emitted in a step is either ``"draft"`` (proposed by a
proposer and accepted by the target's verification) or ``"target"`` (produced
by the target itself: the bonus token after a fully accepted draft, the
correction at the first rejection, or a plain step).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from .labels import ControlKind, StopReason
    from .stats import RequestStats


@dataclass(frozen=True)
class RequestStarted:
    request_id: int
    prompt_tokens: int
    proposer: str  # configured proposer name ("none" for the plain path)
    target: str
    draft: str | None = None


@dataclass(frozen=True)
class PrefillDone:
    request_id: int
    n_tokens: int
    seconds: float


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Step:
    """One propose -> verify -> accept round (or one plain step).

    ``tokens`` and ``text`` are what this step emitted (after stop handling);
    ``origins[i]`` says where ``tokens[i]`` came from.
    """

    request_id: int
    tokens: tuple[int, ...]
    text: str
    origins: tuple[str, ...]
    proposer: str | None  # which proposer drafted this step; None = plain step
    drafted: int  # tokens proposed and sent to verification
    accepted: int  # of those, accepted by the target
    draft_seconds: float
    verify_seconds: float
    elapsed: float  # seconds since the request started
    logprobs: tuple[TokenLogprob, ...] = ()
    # per-token text aligned with ``tokens`` ("".join(pieces) == text; a token that only
    # starts a multi-byte character has "" and the one completing it carries it), so
    # adapters can colour each token by origin; () when the engine does not fill it
    pieces: tuple[str, ...] = ()


@dataclass(frozen=True)
class Control:
    """A decision of the speculation controller, with its reason (fallback, probe, guard trip...)."""

    request_id: int
    kind: ControlKind
    reason: str
    k: int | None = None
    proposer: str | None = None


@dataclass(frozen=True)
class Finished:
    request_id: int
    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    stats: "RequestStats" = field(repr=False)
    logprobs: tuple[TokenLogprob, ...] = ()  # per emitted token, when requested


Event = Union[RequestStarted, PrefillDone, Step, Control, Finished]
