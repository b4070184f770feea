"""Live numbers for the panels, folded from one request's events.

Everything here is computed from event fields only (times included), never from
the wall clock, so a replayed script draws exactly what the live run drew.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

from ..api.events import Control, Event, Finished, PrefillDone, RequestStarted, Step
from ..api.stats import RequestStats

#: verify passes in the sliding acceptance window
WINDOW = 32
#: verify passes the sparkline shows
SPARK_POINTS = 64
#: steps the "tokens/s now" rate spans (after the first token, like every decode rate)
RATE_STEPS = 16
#: relative cost of each extra token in a verify pass, used only when no plain
#: step has been timed: a pass over 1 + k tokens costs about (1 + VERIFY_SLOPE * k)
#: single-token steps. 0.25 fits the Qwen2.5 1.5B costs measured on this CPU class
#: (k=5: 2.06, k=8: 2.86, k=10: 3.28 single steps; docs models.md).
VERIFY_SLOPE = 0.25
#: plain steps needed before their mean time is trusted over the cost model
MIN_PLAIN_STEPS = 3


def fold_stats(events: Iterable[Event]) -> RequestStats:
    """RequestStats rebuilt from events, for streams that ended without a Finished."""
    stats = RequestStats()
    for ev in events:
        _observe(stats, ev)
    return stats


def _observe(stats: RequestStats, ev: Event) -> None:
    if isinstance(ev, RequestStarted):
        stats.proposer = ev.proposer
        stats.prompt_tokens = ev.prompt_tokens
    elif isinstance(ev, PrefillDone):
        stats.observe_prefill(ev.n_tokens, ev.seconds)
    elif isinstance(ev, Step) and not (ev.tokens or ev.drafted or ev.verify_seconds):
        stats.total_seconds = ev.elapsed  # the engine's closing step: held-back text, no pass
    elif isinstance(ev, Step):
        stats.observe_step(proposer=ev.proposer, drafted=ev.drafted, accepted=ev.accepted,
                           emitted=len(ev.tokens), draft_seconds=ev.draft_seconds,
                           verify_seconds=ev.verify_seconds, elapsed=ev.elapsed)
        stats.total_seconds = ev.elapsed
    elif isinstance(ev, Control):
        stats.observe_control(ev.kind)


@dataclass(frozen=True)
class PlainEstimate:
    tokens_per_second: float
    basis: str  # "measured" (timed plain steps) or "model" (verify passes / cost model)


class LiveMetrics:
    """One request's running numbers.

    ``plain_timing`` is (steps, seconds) of plain steps seen earlier on the same
    target, so a plain run once makes every later estimate a measured one.
    """

    def __init__(self, plain_timing: tuple[int, float] = (0, 0.0)) -> None:
        self.stats = RequestStats()
        self.finished: Finished | None = None
        self.target = ""
        self.k: int | None = None
        self.proposer_now: str | None = None  # who drafted the last pass
        self.controls: deque[Control] = deque(maxlen=8)
        self.pass_acceptance: deque[float] = deque(maxlen=SPARK_POINTS)
        self._window: deque[tuple[int, int]] = deque(maxlen=WINDOW)
        # (elapsed, tokens) of the steps since the first token: the first entry only anchors
        # the window's start, so prefill and TTFT never enter the rate
        self._steps: deque[tuple[float, int]] = deque(maxlen=RATE_STEPS + 1)
        self._prior_plain = plain_timing
        # plain decode steps of this request; the first token's step is not one (it comes
        # out of the prefill pass, in no time of its own)
        self._plain_steps = 0
        self._plain_seconds = 0.0
        self._pass_unit_seconds = 0.0  # verify time / modelled pass cost, summed

    # --- folding -------------------------------------------------------------
    def observe(self, ev: Event) -> None:
        _observe(self.stats, ev)
        if isinstance(ev, RequestStarted):
            self.target = ev.target
        elif isinstance(ev, Step):
            first = not self._steps
            self._steps.append((ev.elapsed, len(ev.tokens)))
            if ev.drafted == 0 and ev.verify_seconds > 0 and not first:
                self._plain_steps += 1
                self._plain_seconds += ev.verify_seconds
            if ev.drafted > 0:
                self.k = ev.drafted
                self.proposer_now = ev.proposer
                self._window.append((ev.drafted, ev.accepted))
                self.pass_acceptance.append(ev.accepted / ev.drafted)
                self._pass_unit_seconds += ev.verify_seconds / (1.0 + VERIFY_SLOPE * ev.drafted)
        elif isinstance(ev, Control):
            self.controls.append(ev)
            if ev.k is not None:
                self.k = ev.k
        elif isinstance(ev, Finished):
            self.finished = ev
            self.stats = ev.stats

    # --- derived ---------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def window_acceptance(self) -> float | None:
        drafted = sum(d for d, _ in self._window)
        return sum(a for _, a in self._window) / drafted if drafted else None

    @property
    def tokens_per_second_now(self) -> float:
        """Decode rate over the last few steps; once the request is done, over all of it.

        Both are RequestStats' definition (tokens after the first over the time after
        the first), so the rate divides by the plain decode rate into a fair speedup.
        """
        if self.finished is not None:
            return self.stats.decode_tokens_per_second
        if len(self._steps) < 2:
            return 0.0
        span = self._steps[-1][0] - self._steps[0][0]
        n = sum(k for _, k in list(self._steps)[1:])
        return n / span if span > 0 else 0.0

    @property
    def ttft_seconds(self) -> float | None:
        return self.stats.ttft_seconds

    @property
    def plain_timing(self) -> tuple[int, float]:
        """Plain decode steps and their seconds, this request plus what came before."""
        steps, seconds = self._prior_plain
        return steps + self._plain_steps, seconds + self._plain_seconds

    def plain_estimate(self) -> PlainEstimate | None:
        """What the plain path would do on this target, decode only.

        Measured from timed plain steps when there are enough (this request or
        earlier ones on the same target); otherwise each verify pass's time
        divided by its modelled cost in single steps (see VERIFY_SLOPE).
        """
        steps, seconds = self.plain_timing
        if steps >= MIN_PLAIN_STEPS and seconds > 0:
            return PlainEstimate(steps / seconds, "measured")
        if self.stats.verify_passes and self._pass_unit_seconds > 0:
            return PlainEstimate(self.stats.verify_passes / self._pass_unit_seconds, "model")
        return None

    @property
    def time_split(self) -> dict[str, float]:
        """Seconds spent so far per phase: prefill, drafting, verify passes (steps that
        checked a draft) and plain steps (one token, nothing drafted: a Step with
        ``drafted == 0``, RequestStats.plain_seconds), each under its own label."""
        s = self.stats
        return {"pre": s.prefill_seconds, "draft": s.draft_seconds,
                "verify": s.verify_seconds, "plain": s.plain_seconds}
