"""Speculation control: before each step, which proposer drafts and how many tokens.

The engine asks a controller before every step and tells it what happened after:

    ctl = make_controller(settings, proposers={"ngram": False, "draft": True},
                          calibration=cal, guard=engine_guard)
    view = StepView(generated=n, remaining=max_tokens - n,
                    candidates={"ngram": ngram_session.propose(settings.max_draft)})
    d = ctl.decide(view)          # Decision(proposer="ngram", k=3, reason=...) or proposer=None
    ...                           # draft d.k tokens (a candidate is truncated to d.k), verify
    ctl.observe(Outcome(proposer=d.proposer, drafted=3, accepted=2, draft_seconds=...,
                        verify_seconds=..., tokens=emitted))
    for rec in ctl.drain_events(): yield Control(request_id, *rec)

Conventions. ``Decision.k`` counts *draft tokens* (0 = a plain step). The cost
curve (:mod:`edgespec.calibration`) counts *tokens in the batch*, so verifying
k drafts is a (k + 1)-token pass costing ``cal.cost(k + 1)``.

The economics. A draft of d tokens whose positions are accepted with
conditional probabilities p_1..p_d (p_i: accepted given that every earlier one
was) emits on average E(d) = 1 + p_1 + p_1 p_2 + ... + p_1...p_d tokens (the 1
is the target's own token) and takes t(d + 1) + draft_time(d) seconds, against
one token in t(1) for a plain step. The adaptive controller picks the proposer
and d with the highest E / time and drafts only if that beats a plain step by
``margin``. On the 2-core CPU t(2) = 1.5 t(1), so a 1-token draft must be
accepted more than half the time to pay; on a GPU t(k) ≈ t(1) and long drafts
pay at modest acceptance. The same rule covers both: nothing is tuned per device
except the measured curve.

Where the p_i come from (:class:`AcceptanceModel`): recency-weighted acceptance
counts per proposer, grouped by what the proposer says about the token (its
confidence band and match-length bucket), by whether its previous draft got the
first token right (acceptance comes in bursts) and by draft position, each level
shrunk towards the one above and the top towards a prior that is itself scaled
by how this request's text has compared with the priors so far. An engine may
keep a :class:`ControlMemory` to seed each request from earlier ones (off by
default: on recorded traces it did not help). Drafts of free proposers (n-gram, suffix) are
proposed before the decision at no real cost and handed in as candidates; every
candidate, used or not, is later scored against the tokens the target actually
emitted (the target's greedy choice is what verification would have compared
against; under sampling, a match happens with exactly the probability a
point-mass draft is accepted), so the controller keeps learning while it takes
plain steps, and a request that turns repetitive regains speculation.

Two safety nets on top of the estimates:

* the *floor* (per request and proposer): when the verified acceptance over a
  sliding window falls below it, that proposer stops drafting; it is tried again
  when shadow scoring says its drafts match again, when its match gets long, or
  after a probe interval that doubles after each failed probe;
* the *goodput guard* (:class:`GoodputGuard`, one per engine): it compares the
  goodput of speculative steps with the time of plain steps over a window and,
  when the lower confidence bound of the improvement falls below the threshold,
  disables that proposer for that traffic slice; it re-enables on fresh evidence
  from occasional probe steps.

Every change of mode (fallback, probe, recover, guard_off, guard_on, guarded)
is recorded as a :class:`ControlRecord` for the engine to emit as
:class:`edgespec.events.Control`.
"""
from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Mapping, NamedTuple, Protocol, Sequence

from .calibration import Calibration
from .errors import InvalidInputError
from .proposers.base import Draft


# --- settings, decisions, outcomes -------------------------------------------
@dataclass(frozen=True)
class ControlSettings:
    """What a user can set (``--draft-len``, ``--no-adapt``, ``--floor``, ...)."""

    adaptive: bool = True
    proposer: str | None = None  # fixed mode: the proposer to use (None = plain path)
    draft_length: int = 4  # fixed mode: drafts per step
    min_draft: int = 1  # adaptive: never draft fewer (a shorter best choice means a plain step)
    max_draft: int = 15  # adaptive: never draft more (15 drafts = a 16-token verify pass)
    floor: float | None = None  # min verified acceptance; None = min(0.6, break-even + 0.1)
    floor_window: int = 32  # verified positions the floor looks at
    floor_min: int = 16  # positions needed before the floor judges
    window: int = 16  # about this many recent drafts (used or shadow-scored) drive the estimates
    margin: float = 0.08  # a draft must beat a plain step's goodput by this fraction
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

    def validate(self) -> "ControlSettings":
        _guard(self.draft_length >= 1, f"draft length must be >= 1 (got {self.draft_length})")
        _guard(self.min_draft >= 1, f"min draft length must be >= 1 (got {self.min_draft})")
        _guard(self.max_draft >= self.min_draft,
               f"max draft length ({self.max_draft}) must be >= min draft length ({self.min_draft})")
        _guard(self.floor is None or 0.0 <= self.floor < 1.0,
               f"the acceptance floor must be in [0, 1) (got {self.floor})")
        _guard(self.floor_window >= self.floor_min >= 1,
               "floor window must be >= floor_min >= 1")
        _guard(self.window >= 1, f"window must be >= 1 (got {self.window})")
        _guard(self.margin >= 0.0, f"margin must be >= 0 (got {self.margin})")
        _guard(self.guard_threshold > 0.0,
               f"guard threshold is a speedup ratio and must be > 0 (got {self.guard_threshold})")
        _guard(self.guard_window >= self.guard_min_steps >= 2,
               "guard window must be >= guard_min_steps >= 2")
        _guard(self.guard_probe_every >= 1, "guard_probe_every must be >= 1")
        _guard(self.probe_after >= 1 and self.probe_after_max >= self.probe_after,
               "probe_after must be >= 1 and <= probe_after_max")
        _guard(self.probe_draft >= 1, "probe_draft must be >= 1")
        return self


def _guard(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInputError(message)


@dataclass(frozen=True)
class StepView:
    """What the engine knows before a step."""

    generated: int = 0  # tokens emitted so far in this request
    remaining: int | None = None  # tokens still allowed (max_tokens - generated); None = no limit
    # drafts free proposers already made for this step (proposed at max_draft; the engine
    # truncates the chosen one to Decision.k)
    candidates: Mapping[str, Draft] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    proposer: str | None  # None = plain step
    k: int  # draft tokens to propose / keep (0 for a plain step)
    reason: str
    expected_tokens: float = 1.0  # E(k), the model's forecast of tokens this step emits
    expected_speedup: float = 1.0  # forecast goodput relative to a plain step

    @property
    def plain(self) -> bool:
        return self.proposer is None or self.k <= 0


PLAIN = Decision(None, 0, "plain path")


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

    @classmethod
    def of(cls, step, draft: Draft | None = None) -> "Outcome":
        """From an :class:`edgespec.events.Step` and the draft that was verified."""
        return cls(proposer=step.proposer, drafted=step.drafted, accepted=step.accepted,
                   draft_seconds=step.draft_seconds, verify_seconds=step.verify_seconds,
                   tokens=tuple(step.tokens),
                   confidence=draft.confidence if draft is not None else None,
                   match_length=draft.match_length if draft is not None else 0)


class ControlRecord(NamedTuple):
    """A mode change, field order matching ``events.Control`` after its request_id."""

    kind: str  # fallback | probe | recover | guard_off | guard_on | guarded
    reason: str
    draft_length: int | None = None
    proposer: str | None = None


class Controller(Protocol):
    def decide(self, view: StepView) -> Decision: ...

    def observe(self, outcome: Outcome) -> None: ...

    def drain_events(self) -> list[ControlRecord]: ...


# --- the fixed controller ----------------------------------------------------
class FixedController:
    """Always the configured proposer at the configured length (``--draft-len N --no-adapt``)."""

    def __init__(self, proposer: str | None, k: int) -> None:
        if proposer is not None and k < 1:
            raise InvalidInputError(f"draft length must be >= 1 (got {k})")
        self.proposer = proposer
        self.k = k

    def decide(self, view: StepView) -> Decision:
        if self.proposer is None:
            return PLAIN
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


# --- acceptance estimates ----------------------------------------------------
class Feature(NamedTuple):
    key: tuple  # bucket the token is counted in
    prior: float  # acceptance assumed before any data


_POSITION_ONLY = ("p",)
# first-token acceptance before any evidence, by n-gram match length (cautious versions of
# what prompt lookup achieved on Spec-Bench outputs of Qwen2.5-Coder-1.5B: 0.40 at 2 tokens,
# 0.75 at 3, 0.78 at 4-5); a confidence c gets 0.1 + 0.6 c (suffix-tree frequencies of 1.0
# were right 60% of the time)
_MATCH_PRIORS = ((1, 0.25), (2, 0.35), (3, 0.5), (5, 0.6), (8, 0.7), (15, 0.75))
_MATCH_PRIOR_TOP = 0.8


def _position_bucket(i: int) -> int:
    return i if i < 4 else 4 if i < 6 else 6 if i < 9 else 9


def _match_prior(match_length: int) -> tuple[int, float]:
    for top, prior in _MATCH_PRIORS:
        if match_length <= top:
            return top, prior
    return 99, _MATCH_PRIOR_TOP


def token_features(n: int, confidence: Sequence[float] | None, match_length: int,
                   base_prior: float = 0.4) -> list[Feature]:
    """Bucket each of the first ``n`` draft tokens by what the proposer said about it.

    A per-token confidence (draft-model probability, suffix-tree frequency) is
    binned low / mid / high and, when the proposer also reports a match length,
    paired with its bucket: a frequency of 1.0 means little after a one-token
    match seen once. Without confidence the n-gram match length alone decides;
    without either, position alone.
    """
    if confidence is not None and len(confidence) >= n:
        top, mprior = _match_prior(match_length) if match_length > 0 else (0, 1.0)
        out = []
        for c in confidence[:n]:
            c = min(max(float(c), 0.0), 1.0)
            b = 0 if c < 0.3 else 1 if c < 0.8 else 2
            out.append(Feature(("c", b, top), min(0.1 + 0.6 * c, mprior)))
        return out
    if match_length > 0:
        top, prior = _match_prior(match_length)
        return [Feature(("m", top), prior)] * n
    return [Feature(_POSITION_ONLY, base_prior)] * n


class AcceptanceModel:
    """Recency-weighted conditional acceptance of one proposer's draft tokens.

    Each draft contributes its *verified* positions: those before the first
    rejection (accepted) and the first rejected one; later positions say nothing
    (they were conditioned on a wrong prefix). A token is counted under its
    feature (confidence or match-length bucket), under (feature, state) and
    under (feature, state, position), where *state* says whether the proposer's
    previous draft got its first token right: acceptance is bursty (a copied
    span accepts run after run, then novel text rejects run after run), and that
    one bit tells the two regimes apart at once. Each level's estimate is shrunk
    towards the level above, the top towards the feature's prior. Every token is
    also counted in the position-only track, which predicts drafts made after the
    decision (a draft model's, whose confidences are not known yet). Older
    evidence fades by ``1 - 1/window`` per step.
    """

    rescale = True
    rescale_strength = 30.0  # tokens of evidence before the text's own rate moves the priors much

    def __init__(self, window: float = 16, strength: float = 6.0) -> None:
        self.window = window
        self.decay = 1.0 - 1.0 / window
        self.strength = strength
        self._counts: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.records = 0
        self.weight = 0.0  # decayed number of drafts behind the counts
        # accepted vs prior-expected verified tokens: how this text compares with the priors
        self._seen = [0.0, 0.0]

    def seeded_copy(self, window: float, max_weight: float) -> "AcceptanceModel":
        """A fresh model (memory ``window``) that starts from this one's evidence, worth
        at most ``max_weight`` drafts: an informed prior that the new request's own
        drafts soon outweigh."""
        m = AcceptanceModel(window, self.strength)
        f = min(1.0, max_weight / self.weight) if self.weight > 0 else 0.0
        for key, (a, n) in self._counts.items():
            if n * f > 1e-6:
                m._counts[key] = [a * f, n * f]
        m.weight = self.weight * f
        m._seen = [self._seen[0] * f, self._seen[1] * f]
        return m

    @staticmethod
    def _levels(i: int, f: Feature, state: bool | None) -> tuple[tuple, tuple, tuple]:
        return (f.key,), (f.key, state), (f.key, state, _position_bucket(i))

    def tick(self) -> None:
        """One step passed: older evidence fades (and what has faded to nothing is dropped)."""
        dead = []
        for key, c in self._counts.items():
            c[0] *= self.decay
            c[1] *= self.decay
            if c[1] < 1e-3:
                dead.append(key)
        for key in dead:
            del self._counts[key]
        self._seen[0] *= self.decay
        self._seen[1] *= self.decay
        self.weight = self.weight * self.decay + 1.0

    def add(self, i: int, f: Feature, ok: bool, state: bool | None = None) -> None:
        """One verified token: draft position ``i``, accepted or not."""
        keys = list(self._levels(i, f, state))
        if f.key != _POSITION_ONLY:
            keys += self._levels(i, Feature(_POSITION_ONLY, 0.0), state)
        for key in keys:
            c = self._counts[key]
            c[0] += ok
            c[1] += 1
        self._seen[0] += ok
        self._seen[1] += f.prior

    def record(self, features: Sequence[Feature], accepted: int, state: bool | None = None) -> None:
        """A whole verified draft, as one step."""
        self.tick()
        for i in range(min(accepted + 1, len(features))):
            self.add(i, features[i], i < accepted, state)
        self.records += 1

    def predict(self, features: Sequence[Feature], state: bool | None = None) -> list[float]:
        # scale every prior by how this request's text has compared with them so far, so a
        # bucket with no evidence yet still reflects that the text copies its input or not
        a, e = self._seen
        ratio = (a + self.rescale_strength) / (e + self.rescale_strength) if self.rescale else 1.0
        out = []
        for i, f in enumerate(features):
            p = min(max(f.prior * ratio, 0.02), 0.95)
            for key in self._levels(i, f, state):
                a, n = self._counts.get(key, (0.0, 0.0))
                p = (a + self.strength * p) / (n + self.strength)
            out.append(min(max(p, 0.01), 0.99))
        return out


def expected_tokens(p: Sequence[float]) -> list[float]:
    """E(d) for d = 0..len(p): 1 + p1 + p1 p2 + ... (the 1 is the target's own token)."""
    out = [1.0]
    run = 1.0
    for x in p:
        run *= x
        out.append(out[-1] + run)
    return out


# --- the goodput guard -------------------------------------------------------
@dataclass(frozen=True)
class GuardEstimate:
    speedup: float  # speculative goodput × plain-step time (1.0 = break-even)
    lower: float  # lower confidence bound of that
    spec_steps: int
    plain_steps: int
    enabled: bool


class _SliceState:
    def __init__(self, window: int) -> None:
        self.spec: deque[tuple[int, float]] = deque(maxlen=window)  # (tokens, seconds)
        self.enabled = True
        self.asks = 0
        self.gap = 0  # while disabled: asks between probes (grows while probes keep failing)
        self.fresh = 0  # speculative steps since the last judgement


class GoodputGuard:
    """Engine-wide check that speculation pays, per (traffic slice, proposer).

    Plain-step times are shared by a slice; speculative steps are kept per
    proposer. The speedup estimate is (tokens / seconds over speculative steps)
    × (mean plain-step seconds), with a delta-method confidence interval. When
    its lower bound falls below ``guard_threshold`` (judged after
    ``guard_min_steps`` speculative steps, then every quarter of that) the
    proposer is disabled for that slice; its window is cleared, one speculative
    step in ``guard_probe_every`` is admitted as a probe, and it is re-enabled
    once a batch of probes (a quarter window) alone lifts the lower bound back
    over the threshold (each batch that fails doubles the spacing, up to 16 times). Until enough plain steps exist, the calibration's step
    time stands in for them.
    """

    def __init__(self, settings: ControlSettings | None = None,
                 plain_seconds_prior: float | None = None) -> None:
        self.settings = (settings or ControlSettings()).validate()
        self.plain_seconds_prior = plain_seconds_prior
        self._plain: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=self.settings.guard_window))
        self._slices: dict[tuple[str, str], _SliceState] = {}

    def _state(self, slice_: str, proposer: str) -> _SliceState:
        key = (slice_, proposer)
        st = self._slices.get(key)
        if st is None:
            st = self._slices[key] = _SliceState(self.settings.guard_window)
        return st

    def admits(self, slice_: str, proposer: str) -> str:
        """"on", "probe" (disabled, but this step may gather evidence) or "off"."""
        st = self._state(slice_, proposer)
        if st.enabled:
            return "on"
        st.asks += 1
        if st.asks >= st.gap:
            st.asks = 0
            return "probe"
        return "off"

    def enabled(self, slice_: str, proposer: str) -> bool:
        return self._state(slice_, proposer).enabled

    def observe_plain(self, slice_: str, seconds: float) -> None:
        if seconds > 0:
            self._plain[slice_].append(seconds)

    def observe_spec(self, slice_: str, proposer: str, tokens: int,
                     seconds: float) -> ControlRecord | None:
        """Record one speculative step; returns the record of a mode change, if any."""
        if seconds <= 0 or tokens <= 0:
            return None
        st = self._state(slice_, proposer)
        st.spec.append((tokens, seconds))
        st.fresh += 1
        s = self.settings
        # judge a full window, then again every quarter window of new steps (testing after
        # every step would turn a 5% false-alarm rate into a certainty on long runs);
        # while disabled, judge each batch of probes once
        need = s.guard_min_steps if st.enabled else max(s.guard_min_steps // 4, 8)
        if len(st.spec) < need or st.fresh < (max(need // 4, 1) if st.enabled else need):
            return None
        st.fresh = 0
        est = self.estimate(slice_, proposer)
        if est is None:
            return None
        tag = f"{proposer}" + (f" on {slice_}" if slice_ != "default" else "")
        if st.enabled and est.lower < s.guard_threshold:
            st.enabled = False
            st.spec.clear()
            st.asks = 0
            st.gap = s.guard_probe_every
            return ControlRecord("guard_off", f"{tag}: speedup {est.speedup:.2f}x, lower bound "
                                 f"{est.lower:.2f} < {s.guard_threshold:.2f} over {est.spec_steps} "
                                 "speculative steps; plain decoding until probes show a gain",
                                 proposer=proposer)
        if not st.enabled and est.lower < s.guard_threshold:
            # the probes did not show a gain: start a fresh batch, further apart
            st.spec.clear()
            st.gap = min(st.gap * 2, 16 * s.guard_probe_every)
            return None
        if not st.enabled:
            st.enabled = True
            return ControlRecord("guard_on", f"{tag}: probes show speedup {est.speedup:.2f}x, lower "
                                 f"bound {est.lower:.2f} >= {s.guard_threshold:.2f} over "
                                 f"{est.spec_steps} steps", proposer=proposer)
        return None

    def estimate(self, slice_: str, proposer: str) -> GuardEstimate | None:
        st = self._state(slice_, proposer)
        n = len(st.spec)
        plain = self._plain.get(slice_, ())
        m = len(plain)
        if n < 2 or (m < 2 and self.plain_seconds_prior is None):
            return None
        if m >= 2:
            pm = sum(plain) / m
            pv = sum((x - pm) ** 2 for x in plain) / (m - 1) / m
        else:
            # one calibration number standing in for plain steps: trust it loosely
            pm = self.plain_seconds_prior
            pv = (0.15 * pm) ** 2
        tok = [t for t, _ in st.spec]
        sec = [x for _, x in st.spec]
        tbar, sbar = sum(tok) / n, sum(sec) / n
        r = tbar / sbar
        resid = [t - r * x for t, x in zip(tok, sec)]
        rv = sum(e * e for e in resid) / (n - 1) / n / (sbar * sbar)
        speedup = r * pm
        rel = rv / (r * r) + pv / (pm * pm)
        lower = speedup - self.settings.guard_z * speedup * math.sqrt(rel)
        return GuardEstimate(speedup, lower, n, m, st.enabled)

    def snapshot(self) -> dict[str, dict]:
        """Per "slice/proposer": enabled, speedup, lower bound, step counts (for stats and the TUI)."""
        out = {}
        for (sl, prop), st in self._slices.items():
            est = self.estimate(sl, prop)
            out[f"{sl}/{prop}"] = {
                "enabled": st.enabled,
                "speedup": est.speedup if est else None,
                "lower": est.lower if est else None,
                "spec_steps": len(st.spec),
                "plain_steps": len(self._plain.get(sl, ())),
            }
        return out


# --- what an engine remembers between requests ----------------------------------
class ControlMemory:
    """Engine-wide acceptance evidence per proposer, used to seed each request's estimates.

    Every draft a request scores is also recorded here (with a long memory);
    a new request starts from a copy worth ``seed_weight`` drafts instead of
    the bare priors, so it neither repeats the same costly first mistakes nor
    ignores its own text for long.
    """

    def __init__(self, window: float = 256, seed_weight: float = 8.0) -> None:
        self.window = window
        self.seed_weight = seed_weight
        self.models: dict[str, AcceptanceModel] = {}

    def model(self, proposer: str) -> AcceptanceModel:
        m = self.models.get(proposer)
        if m is None:
            m = self.models[proposer] = AcceptanceModel(self.window)
        return m

    def seed(self, proposer: str, window: float) -> AcceptanceModel:
        return self.model(proposer).seeded_copy(window, self.seed_weight)


# --- the adaptive controller -------------------------------------------------
@dataclass
class _Pending:
    """A draft waiting for enough emitted tokens to be scored."""

    proposer: str
    tokens: tuple[int, ...]
    features: list[Feature]
    start: int  # index in the emitted stream of its first token
    used: bool  # this draft (truncated) was verified: the floor already counted it
    state: bool | None  # the proposer's previous first-token outcome when this was drafted
    done: int = 0  # leading tokens already matched and counted


@dataclass
class _ProposerState:
    costly: bool
    model: AcceptanceModel
    shared: AcceptanceModel | None  # the engine's memory for this proposer
    floor_window: deque  # verified positions of real drafts: True accepted / False rejected
    shadow_window: deque  # the same for shadow-scored drafts since the last fallback
    token_seconds: float | None = None  # measured seconds per drafted token (costly ones)
    fallback: bool = False
    fallback_step: int = 0
    probe_interval: int = 0
    last_evidence: int = 0  # step of the last verified or scored draft
    probing: bool = False
    hit: bool | None = None  # did its latest draft get the first token right?


class AdaptiveController:
    """Chooses proposer and draft length per step to maximise expected tokens per second.

    ``proposers`` maps each loaded proposer's name to whether it is costly
    (:attr:`Proposer.costly`). ``token_seconds`` gives the per-token cost of
    costly ones when known (the draft model's calibration step time); it is
    refined from observed draft times. ``guard`` is the engine's
    :class:`GoodputGuard` (None: no guard); ``slice_`` names this request's
    traffic slice for it. ``memory`` is the engine's :class:`ControlMemory`
    (None: every request starts from the priors).
    """

    def __init__(self, proposers: Mapping[str, bool], calibration: Calibration | None = None,
                 settings: ControlSettings | None = None, guard: GoodputGuard | None = None,
                 slice_: str = "default", token_seconds: Mapping[str, float] | None = None,
                 memory: ControlMemory | None = None) -> None:
        self.settings = s = (settings or ControlSettings()).validate()
        self.cal = calibration or Calibration.prior_cpu()
        self.guard = guard if s.guard else None
        self.slice = slice_
        self.floor = s.floor if s.floor is not None else min(0.6, self.cal.cost(2) - 1.0 + 0.1)
        self._p: dict[str, _ProposerState] = {}
        for name, costly in proposers.items():
            self._p[name] = _ProposerState(
                costly=bool(costly),
                model=memory.seed(name, s.window) if memory else AcceptanceModel(s.window),
                shared=memory.model(name) if memory else None,
                floor_window=deque(maxlen=s.floor_window), shadow_window=deque(maxlen=s.floor_window),
                token_seconds=(token_seconds or {}).get(name), probe_interval=s.probe_after)
        self._scale = 1.0  # observed / calibrated pass time (load, context length)
        self._step = 0
        self._emitted: list[int] = []
        self._pending: list[_Pending] = []
        self._view: StepView | None = None
        self._decision: Decision | None = None
        self._events: list[ControlRecord] = []
        self._guarded_told = False
        self.decisions = 0
        self.drafts = 0

    # --- time model ------------------------------------------------------------
    def pass_seconds(self, n: int) -> float:
        """Forecast wall time of an n-token target pass."""
        return self._scale * self.cal.seconds(n)

    def _draft_seconds(self, name: str, d: int, has_candidate: bool) -> float:
        st = self._p[name]
        if has_candidate or not st.costly:
            return 0.0  # already paid (candidate) or negligible (free proposers)
        per = st.token_seconds if st.token_seconds is not None else 0.5 * self.pass_seconds(1)
        return per * d

    # --- decide ------------------------------------------------------------------
    def decide(self, view: StepView) -> Decision:
        self._step += 1
        self.decisions += 1
        self._view = view
        d = self._decide(view)
        self._decision = d
        if not d.plain:
            self.drafts += 1
        return d

    def _decide(self, view: StepView) -> Decision:
        s = self.settings
        cap = s.max_draft if view.remaining is None else min(s.max_draft, view.remaining - 1)
        if cap < s.min_draft or not self._p:
            return Decision(None, 0, "too few tokens left to draft" if self._p else "no proposer")
        t1 = self.pass_seconds(1)
        bar = (1 + s.margin) / t1  # the goodput a draft must beat
        best: tuple[float, str, int, float, str] | None = None  # rate, name, d, E(d), note
        blocked: list[str] = []
        for name, st in self._p.items():
            cand = view.candidates.get(name)
            if cand is not None and len(cand) == 0:
                continue  # the proposer has nothing worth drafting here
            if cand is None and not st.costly and view.candidates:
                continue  # a free proposer the engine did not consult this step
            admit = self.guard.admits(self.slice, name) if self.guard else "on"
            if admit == "off":
                blocked.append(name)
                continue
            n_max = min(cap, len(cand)) if cand is not None else cap
            if n_max < s.min_draft:
                continue
            feats = token_features(n_max, cand.confidence if cand else None,
                                   cand.match_length if cand else 0)
            e = expected_tokens(st.model.predict(feats, st.hit))

            def rate(dd: int) -> float:
                return e[dd] / (self.pass_seconds(dd + 1) + self._draft_seconds(name, dd, cand is not None))

            dd = max(range(s.min_draft, n_max + 1), key=rate)
            gate, why = self._gate(st, cand, rate(dd) > bar)
            if gate is None:
                continue
            if gate == "probe":
                if rate(dd) <= bar:
                    dd = min(max(s.probe_draft, s.min_draft), n_max)  # short: just gather evidence
                note = f"probe: {why}"
            elif rate(dd) <= bar:
                continue
            else:
                note = "guard probe" if admit == "probe" else ""
            # evidence-gathering steps go first; otherwise the best goodput wins
            if best is None or (note.startswith("probe"), rate(dd)) > (best[4].startswith("probe"), best[0]):
                best = (rate(dd), name, dd, e[dd], note)
        if best is None:
            if blocked and not self._guarded_told:
                self._guarded_told = True
                self._events.append(ControlRecord(
                    "guarded", f"speculation with {', '.join(blocked)} is disabled for this traffic "
                    "by the goodput guard", proposer=blocked[0]))
            return Decision(None, 0, "goodput guard" if blocked else "no draft beats a plain step")
        r, name, dd, e, note = best
        if not note:
            self._p[name].probe_interval = self.settings.probe_after
        if note.startswith("probe"):
            st = self._p[name]
            st.probing = True
            if st.fallback:
                st.fallback_step = self._step  # the next probe interval counts from here
            else:
                st.last_evidence = self._step
            self._events.append(ControlRecord("probe", f"{name}: {note[7:]}", dd, name))
        return Decision(name, dd, note or "best expected goodput", expected_tokens=e,
                        expected_speedup=r * t1)

    def _gate(self, st: _ProposerState, cand: Draft | None, worth: bool) -> tuple[str | None, str]:
        """May this proposer draft now? (None | "ok" | "probe", why). Side-effect free."""
        s = self.settings
        if st.fallback:
            if worth and cand is not None and cand.match_length >= s.probe_match:
                return "probe", f"a {cand.match_length}-token match"
            if self._step - st.fallback_step >= st.probe_interval:
                return "probe", f"{self._step - st.fallback_step} steps since falling back"
            return None, ""
        if self._step - st.last_evidence >= st.probe_interval:
            # benched with nothing to learn from (a costly proposer, or no shadow scoring):
            # look again now and then
            return "probe", f"no evidence for {self._step - st.last_evidence} steps"
        return "ok", ""

    # --- observe -----------------------------------------------------------------
    def observe(self, outcome: Outcome) -> None:
        view = self._view
        self._view = self._decision = None
        name = outcome.proposer if outcome.drafted > 0 else None
        n_pass = outcome.drafted + 1 if name else 1
        if outcome.verify_seconds > 0:
            ratio = outcome.verify_seconds / self.cal.seconds(n_pass)
            self._scale += 0.1 * (min(max(ratio, 0.2), 5.0) - self._scale)
        for st in self._p.values():  # evidence fades per step, whoever drafted
            st.model.tick()
            if st.shared is not None:
                st.shared.tick()
        if name in self._p:
            self._observe_draft(name, outcome, view)
        if self.guard is not None:
            if name:
                rec = self.guard.observe_spec(self.slice, name, outcome.accepted + 1,
                                              outcome.draft_seconds + outcome.verify_seconds)
                if rec is not None:
                    self._events.append(rec)
            elif outcome.verify_seconds > 0:
                self.guard.observe_plain(self.slice, outcome.verify_seconds)
        self._score_shadows(outcome, view)

    def _observe_draft(self, name: str, o: Outcome, view: StepView | None) -> None:
        st = self._p[name]
        st.last_evidence = self._step
        if st.costly and o.draft_seconds > 0:
            per = o.draft_seconds / o.drafted
            if st.token_seconds is None:
                st.token_seconds = per
            else:  # a catch-up prefill after a long pause is not the per-token price
                st.token_seconds += 0.2 * (min(per, 3 * st.token_seconds) - st.token_seconds)
        verified = min(o.accepted + 1, o.drafted)
        st.floor_window.extend([True] * o.accepted + [False] * (verified - o.accepted))
        cand = view.candidates.get(name) if view is not None else None
        if not o.tokens or cand is None:
            # no candidate to score later: count the verification itself
            feats = token_features(o.drafted, o.confidence, o.match_length)
            for i in range(verified):
                for m in (st.model, st.shared):
                    if m is not None:
                        m.add(i, feats[i], i < o.accepted, st.hit)
            st.hit = o.accepted > 0
        if st.probing:
            st.probing = False
            rate = o.accepted / verified if verified else 0.0
            if st.fallback and rate >= self.floor and o.accepted > 0:
                self._recover(name, st, f"probe accepted {o.accepted} of {o.drafted}")
            else:
                # failed, or a benched proposer merely re-checked: look less often; being
                # chosen on its merits (below) resets the interval
                st.probe_interval = min(st.probe_interval * 2, self.settings.probe_after_max)
            return
        w = st.floor_window
        if not st.fallback and len(w) >= self.settings.floor_min and sum(w) / len(w) < self.floor:
            st.fallback = True
            st.fallback_step = self._step
            st.shadow_window.clear()
            self._events.append(ControlRecord(
                "fallback", f"{name}: acceptance {sum(w) / len(w):.0%} over the last {len(w)} "
                f"verified draft tokens is below the floor {self.floor:.0%}", 0, name))
            w.clear()

    def _recover(self, name: str, st: _ProposerState, why: str) -> None:
        st.fallback = False
        st.floor_window.clear()
        st.shadow_window.clear()
        st.probe_interval = self.settings.probe_after
        self._events.append(ControlRecord("recover", f"{name}: {why}", None, name))

    def _score_shadows(self, o: Outcome, view: StepView | None) -> None:
        if not o.tokens:
            return
        start = len(self._emitted)
        if view is not None:
            for name, cand in view.candidates.items():
                st = self._p.get(name)
                if st is None:
                    continue
                st.last_evidence = self._step  # consulted and scored: no probe needed
                if len(cand) == 0:
                    continue
                n = min(len(cand), self.settings.max_draft)
                used = o.drafted > 0 and o.proposer == name
                self._pending.append(_Pending(name, tuple(cand.tokens[:n]),
                                              token_features(n, cand.confidence, cand.match_length),
                                              start, used, st.hit))
                st.hit = cand.tokens[0] == o.tokens[0]
        self._emitted.extend(o.tokens)
        keep = []
        for pd in self._pending:
            st = self._p[pd.proposer]
            seen = self._emitted[pd.start:pd.start + len(pd.tokens)]
            j = pd.done
            while j < len(seen) and seen[j] == pd.tokens[j]:
                j += 1
            rejected = j < len(seen)
            # count what became known this step: matches, then the first mismatch
            for i in range(pd.done, j + rejected):
                for m in (st.model, st.shared):
                    if m is not None:
                        m.add(i, pd.features[i], i < j, pd.state)
            pd.done = j
            st.last_evidence = self._step
            if rejected or j == len(pd.tokens):
                if not pd.used:
                    verified = min(j + 1, len(pd.tokens))
                    w = st.shadow_window
                    w.extend([True] * j + [False] * (verified - j))
                    if st.fallback and len(w) >= self.settings.floor_min \
                            and sum(w) / len(w) >= self.floor + 0.05:
                        self._recover(pd.proposer, st, f"its last {len(w)} unused draft tokens "
                                      f"matched {sum(w) / len(w):.0%} of the time")
            else:
                keep.append(pd)
        self._pending = keep
        lo = min((pd.start for pd in keep), default=len(self._emitted))
        if lo > 4096:  # keep the emitted stream short on long generations
            self._emitted = self._emitted[lo:]
            for pd in keep:
                pd.start -= lo

    # --- events --------------------------------------------------------------------
    def drain_events(self) -> list[ControlRecord]:
        out, self._events = self._events, []
        return out

    def in_fallback(self, name: str) -> bool:
        return self._p[name].fallback


# --- the engine's calling convention --------------------------------------------------
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
        ctl = make_controller(replace(settings, proposer=proposer_name), {proposer_name: costly},
                              calibration, guard, slice_,
                              {proposer_name: per_token} if per_token else None, memory)
        return EngineAdapter(ctl, proposer_name, costly, settings.max_draft)

    return factory


def make_controller(settings: ControlSettings, proposers: Mapping[str, bool],
                    calibration: Calibration | None = None, guard: GoodputGuard | None = None,
                    slice_: str = "default", token_seconds: Mapping[str, float] | None = None,
                    memory: ControlMemory | None = None) -> Controller:
    """The controller a request gets: fixed (``adaptive=False``) or adaptive over ``proposers``.

    In fixed mode ``settings.proposer`` (or the only loaded proposer) drafts
    ``settings.draft_length`` tokens every step; an empty ``proposers`` means
    the plain path.
    """
    settings.validate()
    if not proposers:
        return FixedController(None, 1)
    if not settings.adaptive:
        name = settings.proposer or next(iter(proposers))
        return FixedController(name, settings.draft_length)
    return AdaptiveController(proposers, calibration, settings, guard, slice_, token_seconds, memory)


__all__ = [
    "AcceptanceModel", "AdaptiveController", "ControlMemory", "ControlRecord", "ControlSettings",
    "Controller",
    "Decision", "EngineAdapter", "engine_controller_factory", "Feature", "FixedController", "GoodputGuard", "GuardEstimate", "Outcome", "PLAIN",
    "StepView", "expected_tokens", "make_controller", "token_features",
]
