"""The adaptive controller: per step, the proposer and draft length with the highest
expected goodput (tokens per second), or a plain step when no draft beats one.

One idea, kept in one module over 500 lines: the pricing of a step (drafts against the
measured curve), its probes and its guard read the same state on every step, and split
apart they would pass that state back and forth.

The economics. A draft of d tokens emits E(d) tokens on average
(:func:`~edgespec.control.acceptance.expected_tokens`) and takes t(d + 1) + draft_time(d)
seconds, against one token in t(1) for a plain step, where t(n) is the measured time of
an n-token target pass (:mod:`edgespec.calibration`). Every d from ``min_draft`` to the
candidate's length is tried on the curve as measured: the curve need not be monotone (on a
2-core CPU with repacked weights a 4-token pass takes the 4-column gemm and costs less than
a 3-token one), so no shape is assumed. A draft is taken only if it beats a plain step by
``margin``; it grows only while its extra tokens pay for the extra time with
``extend_margin`` to spare (the extra rows cost for certain, the deep positions' tokens
are the least sure). On that CPU t(2) = 1.5 t(1), so a 1-token draft must be accepted more
than half the time to pay; on a GPU t(k) ≈ t(1) and long drafts pay at modest acceptance.
Nothing is tuned per device except the measured curve.

Free proposers (n-gram, suffix) hand in their drafts as candidates before the decision,
all of them at every step; every candidate, used or not, is later scored against the
tokens the target actually emitted (the target's greedy choice is what verification
would have compared against; under sampling, a match happens with exactly the
probability a point-mass draft is accepted), so the controller keeps learning while it
takes plain steps, and a request that turns repetitive regains speculation. A costly
proposer (a draft model) is chosen on its position-only estimates and its measured
per-token time, and drafts only after the decision.

Two safety nets on top of the estimates:

* the *floor* (per request and proposer): when the verified acceptance over a
  sliding window falls below it, that proposer stops drafting; it is tried again
  when shadow scoring says its drafts match again, when its match gets long, or
  after a probe interval that doubles after each failed probe;
* the *goodput guard* (:class:`~edgespec.control.guard.GoodputGuard`, one per engine):
  it compares the goodput of speculative steps with the time of plain steps over a
  window and, when the lower confidence bound of the improvement falls below the
  threshold, disables that proposer for that traffic slice; it re-enables on fresh
  evidence from occasional probe steps.

*Reproducible* requests (``deterministic=True``: greedy or seeded, outside ``--exact``,
:func:`~edgespec.control.settings.reproducible`) decide on the request and the setup
only: the cached calibration curve as it is (no scaling by measured pass times), a
costly proposer's price as the request found it (not re-measured during the request),
the acceptance priors (not the engine's memory of other requests), and no guard verdict
(other requests' rates). What the request itself accepts still steers it. The one input
left that a clock set is that starting price of a draft model (its running estimate
across requests): pricing it by a guess instead made greedy draft-model requests draft
less where the draft is cheap, which the default must not pay for. Its passes
are then the same whenever it is sent alone, so batch-dependent logits cannot make its
text differ at a near-tie; it still reports its timings to the guard for the others.

Every change of mode (fallback, probe, recover, guard_off, guard_on, guarded) is
recorded as a :class:`~edgespec.control.settings.ControlRecord` for the engine to emit
as :class:`edgespec.api.events.Control`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal, Mapping, Optional

from ..calibration.curve import Calibration
from ..proposers.base import Draft
from .acceptance import (AcceptanceModel, ControlMemory, Feature, expected_tokens, token_features,
                         wilson_upper)
from .guard import GoodputGuard
from .policy import ADAPTIVE, CAPS, PLAIN, Policy, PolicyChooser
from .settings import ControlRecord, ControlSettings, Decision, Outcome, StepView


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


#: each policy's step as planned: (the proposer that would draft or None, its draft length)
_Plan = dict[Policy, tuple[Optional[str], int]]


@dataclass
class _OpenStep:
    """A step whose policies' counterfactuals the emitted tokens have not all decided."""

    start: int  # index in the emitted stream of the step's first token
    width: int  # tokens the step emitted (its weight in the comparison)
    plan: _Plan
    candidates: dict[str, tuple[int, ...]]  # every free proposer's draft at the step


@dataclass(frozen=True)
class _Choice:
    """One proposer's best draft this step, as :meth:`AdaptiveController._decide` weighs it.

    ``kind``: "best" (it beats a plain step on its merits), "probe" (the proposer is
    benched or unseen and this step gathers evidence; ``why`` says what earned it) or
    "guard_probe" (it beats a plain step, and the guard admits it as its probe)."""

    rate: float  # expected goodput, tokens per second
    proposer: str
    k: int  # draft length
    expected: float  # E(k), tokens the step is expected to emit
    kind: Literal["best", "probe", "guard_probe"]
    why: str = ""

    @property
    def rank(self) -> tuple[bool, float]:
        """Evidence-gathering steps go first; otherwise the best goodput wins."""
        return self.kind == "probe", self.rate

    @property
    def reason(self) -> str:
        if self.kind == "probe":
            return f"probe: {self.why}"
        return "guard probe" if self.kind == "guard_probe" else "best expected goodput"


@dataclass
class _ProposerState:
    costly: bool
    model: AcceptanceModel
    shared: AcceptanceModel | None  # the engine's memory for this proposer
    floor_window: deque[bool]  # verified positions of real drafts: True accepted / False rejected
    shadow_window: deque[bool]  # the same for shadow-scored drafts since the last fallback
    token_seconds: float | None = None  # measured seconds per drafted token (costly ones)
    fallback: bool = False
    fallback_step: int = 0
    probe_interval: int = 0
    last_evidence: int = 0  # step of the last verified or scored draft
    probing: bool = False
    hit: bool | None = None  # did its latest draft get the first token right?
    run_best: int = 0  # longest run of its draft tokens that matched in this request


class AdaptiveController:
    """Chooses proposer and draft length per step to maximise expected tokens per second.

    ``proposers`` maps each loaded proposer's name to whether it is costly
    (:attr:`Proposer.costly`). ``token_seconds`` gives the per-token cost of
    costly ones when known (the draft model's calibration step time); it is
    refined from observed draft times. ``guard`` is the engine's
    :class:`GoodputGuard` (None: no guard); ``slice_`` names this request's
    traffic slice for it. ``memory`` is the engine's :class:`ControlMemory`
    (None: every request starts from the priors). ``deterministic``: decide on the
    request and the setup only (the module doc says what that leaves out).
    """

    def __init__(self, proposers: Mapping[str, bool], calibration: Calibration | None = None,
                 settings: ControlSettings | None = None, guard: GoodputGuard | None = None,
                 slice_: str = "default", token_seconds: Mapping[str, float] | None = None,
                 memory: ControlMemory | None = None, *, deterministic: bool = False) -> None:
        self.settings = s = (settings or ControlSettings()).validate()
        self.deterministic = deterministic
        # wall-clock and other requests' evidence would shape a reproducible request's
        # passes: the priors, not the engine's memory
        seeded = None if deterministic else memory
        self.cal = calibration or Calibration.prior_cpu()
        self.guard = guard if s.guard else None
        self.slice = slice_
        self.floor = s.floor if s.floor is not None else min(0.6, self.cal.cost(2) - 1.0 + 0.1)
        self._p: dict[str, _ProposerState] = {}
        for name, costly in proposers.items():
            self._p[name] = _ProposerState(
                costly=bool(costly),
                model=(seeded.seed(name, s.window, s.position_calibration) if seeded
                       else AcceptanceModel(s.window, position_calibration=s.position_calibration)),
                shared=memory.model(name) if memory else None,
                floor_window=deque(maxlen=s.floor_window), shadow_window=deque(maxlen=s.floor_window),
                token_seconds=(token_seconds or {}).get(name), probe_interval=s.probe_after)
        # observed / calibrated pass time (load, context length), for plain steps and for
        # verify passes apart: plain steps are most steps, so one shared factor would keep
        # the passes' own error (measured 20-40% above the curve at real contexts) hidden
        self._scale_plain = 1.0
        self._scale_verify = 1.0
        self._step = 0
        self._emitted: list[int] = []
        self._pending: list[_Pending] = []
        self._view: StepView | None = None
        self._decision: Decision | None = None
        self._events: list[ControlRecord] = []
        self._guarded_told = False
        self.decisions = 0
        self.drafts = 0
        # policy choice (control/policy.py): needs every proposer's draft as a candidate
        # (free ones) to score the policies that did not run
        free = [n for n, st in self._p.items() if not st.costly]
        self.chooser: PolicyChooser | None = None
        if s.policy and free and len(free) == len(self._p):
            pols: list[Policy] = [ADAPTIVE, PLAIN, *((n, k) for n in free for k in CAPS)]
            self.chooser = PolicyChooser(pols, s.policy_window, s.policy_z, s.policy_min)
        self._measured: dict[int, float] = {}  # pass size -> recent measured seconds
        self._open: list[_OpenStep] = []  # steps whose policies are not all scored yet
        self._plan: _Plan | None = None

    # --- time model ------------------------------------------------------------
    def pass_seconds(self, n: int) -> float:
        """Forecast wall time of an n-token target pass."""
        return (self._scale_plain if n <= 1 else self._scale_verify) * self.cal.seconds(n)

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
        n_events = len(self._events)
        d = self._decide(view)
        if self.chooser is not None:
            d = self._follow_policy(self.chooser, view, d, n_events)
        self._decision = d
        if not d.plain:
            self.drafts += 1
        return d

    def _decide(self, view: StepView) -> Decision:
        s = self.settings
        cap = s.max_draft if view.remaining is None else min(s.max_draft, view.remaining - 1)
        if cap < s.min_draft or not self._p:
            return Decision(None, 0, "too few tokens left to draft" if self._p else "no proposer")
        # Under continuous batching the pass also carries other sequences' rows (B of them,
        # expected to emit T tokens): the step's goodput is what counts, so a draft of d
        # must beat (T + 1) / t(B + 1) with (T + E(d)) / t(B + 1 + d). Alone (B = T = 0)
        # this is the single-request rule; as B grows on a compute-bound device the
        # marginal rows cost as much as a whole sequence's token and drafting yields.
        t1 = self.pass_seconds(view.batch_rows + 1)
        bar = (1 + s.margin) * (view.batch_tokens + 1) / t1  # the goodput a draft must beat
        best: _Choice | None = None
        blocked: list[str] = []
        for name, st in self._p.items():
            cand = view.candidates.get(name)
            if cand is not None and len(cand) == 0:
                continue  # the proposer has nothing worth drafting here
            if cand is None and not st.costly and view.candidates:
                continue  # a free proposer the engine did not consult this step
            admit = (self.guard.admits(self.slice, name)
                     if self.guard and not self.deterministic else "on")
            if admit == "off":
                blocked.append(name)
                continue
            n_max = min(cap, len(cand)) if cand is not None else cap
            c = self._weigh(name, st, cand, view, n_max, bar,
                            guard_probe=admit == "probe")
            # evidence-gathering steps go first; otherwise the best goodput wins
            if c is not None and (best is None or c.rank > best.rank):
                best = c
        if best is None:
            return self._no_draft(blocked)
        return self._take(best, t1, view.batch_tokens)

    def _weigh(self, name: str, st: _ProposerState, cand: Draft | None, view: StepView,
               n_max: int, bar: float, *, guard_probe: bool) -> _Choice | None:
        """This proposer's best draft length on the cost curve, if it may and should draft
        (a probe drafts even below the bar, short when it does not pay)."""
        s = self.settings
        if s.ramp:
            n_max = min(n_max, max(s.ramp, 2 * st.run_best))
        if n_max < s.min_draft:
            return None
        feats = token_features(n_max, cand.confidence if cand else None,
                               cand.match_length if cand else 0)
        e = expected_tokens(st.model.predict(feats, st.hit))
        b, bt = view.batch_rows, view.batch_tokens

        def seconds(dd: int) -> float:
            return self.pass_seconds(b + dd + 1) + self._draft_seconds(name, dd, cand is not None)

        def rate(dd: int) -> float:
            return (bt + e[dd]) / seconds(dd)

        # grow the draft while the extra tokens pay for the extra time at the current
        # length's rate with extend_margin to spare: deep positions' estimates are the
        # least sure, the extra rows' price is not (where rows are nearly free, as on a
        # GPU, any likely token pays; a cheaper longer pass is always taken)
        dd = s.min_draft
        for d in range(s.min_draft + 1, n_max + 1):
            if e[d] - e[dd] > (1 + s.extend_margin) * rate(dd) * (seconds(d) - seconds(dd)):
                dd = d
        gate, why = self._gate(st, cand, rate(dd) > bar)
        if gate is None:
            return None
        if gate == "probe":
            if rate(dd) <= bar:
                dd = min(max(s.probe_draft, s.min_draft), n_max)  # short: just gather evidence
            return _Choice(rate(dd), name, dd, e[dd], "probe", why)
        if rate(dd) <= bar:
            return None
        return _Choice(rate(dd), name, dd, e[dd], "guard_probe" if guard_probe else "best")

    def _no_draft(self, blocked: list[str]) -> Decision:
        """A plain step: no proposer's draft beats one, or the guard blocks them (said once
        per request)."""
        if blocked and not self._guarded_told:
            self._guarded_told = True
            self._events.append(ControlRecord(
                "guarded", f"speculation with {', '.join(blocked)} is disabled for this traffic "
                "by the goodput guard", proposer=blocked[0]))
        return Decision(None, 0, "goodput guard" if blocked else "no draft beats a plain step")

    def _take(self, c: _Choice, t1: float, batch_tokens: float) -> Decision:
        """The decision for the chosen draft, with what choosing it starts (a probe)."""
        st = self._p[c.proposer]
        if c.kind == "best":
            st.probe_interval = self.settings.probe_after
        elif c.kind == "probe":
            st.probing = True
            if st.fallback:
                st.fallback_step = self._step  # the next probe interval counts from here
            else:
                st.last_evidence = self._step
            self._events.append(ControlRecord("probe", f"{c.proposer}: {c.why}", c.k, c.proposer))
        return Decision(c.proposer, c.k, c.reason, expected_tokens=c.expected,
                        expected_speedup=c.rate * t1 / (batch_tokens + 1))

    # --- policy choice -------------------------------------------------------------
    def _measured_seconds(self, n: int) -> float:
        m = self._measured.get(n)
        return m if m is not None else self.pass_seconds(n)

    def _follow_policy(self, chooser: PolicyChooser, view: StepView, adaptive: Decision,
                       n_events: int) -> Decision:
        """Plan every policy's step for scoring, and return the incumbent's."""
        cap = len(view.candidates) and (self.settings.max_draft if view.remaining is None
                                        else min(self.settings.max_draft, view.remaining - 1))
        plan: _Plan = {ADAPTIVE: (adaptive.proposer, adaptive.k), PLAIN: (None, 0)}
        for p in chooser.policies:
            if isinstance(p, tuple):
                name, k = p
                cand = view.candidates.get(name)
                kk = min(k, len(cand), cap) if cand is not None else 0
                # not gated by the engine's guard: this request's own paired evidence against
                # the plain policy is what lets a cap run, which is the sharper test
                plan[p] = (name, kk) if kk >= 1 else (None, 0)
        self._plan = plan
        pol = chooser.current
        if pol == ADAPTIVE:
            return adaptive
        # the adaptive decision was only scored: undo what choosing it would have started
        del self._events[n_events:]
        for st in self._p.values():
            st.probing = False
        who, k = plan[pol]
        if who is None:
            return Decision(None, 0, f"policy: {'plain path' if pol == PLAIN else f'cap {pol[1]}'}"
                            " has the best realized goodput")
        return Decision(who, k, f"policy: {who} capped at {pol[1]} has the best realized goodput")

    def _score_policies(self, chooser: PolicyChooser, o: Outcome) -> None:
        """File this step's plan, then score every plan whose drafts the emitted tokens
        have now decided."""
        if self._plan is not None and o.tokens and self._view is not None:
            start = len(self._emitted) - len(o.tokens)
            cands = {n: tuple(c.tokens) for n, c in self._view.candidates.items()}
            self._open.append(_OpenStep(start, len(o.tokens), self._plan, cands))
        self._plan = None
        keep: list[_OpenStep] = []
        em = self._emitted
        for step in self._open:
            start, cands = step.start, step.candidates
            taus: dict[Policy, float] = {}
            for pol, (name, k) in step.plan.items():
                if name is None or k == 0:
                    taus[pol] = self._measured_seconds(1)
                    continue
                toks = cands.get(name, ())[:k]
                seen = em[start:start + len(toks)]
                j = 0
                while j < len(seen) and seen[j] == toks[j]:
                    j += 1
                if j == len(seen) and len(seen) < len(toks):
                    break  # not decided yet
                taus[pol] = self._measured_seconds(k + 1) / (j + 1)
            if len(taus) < len(step.plan):
                if len(em) - start < 64:  # a request's end leaves a few undecided: drop them
                    keep.append(step)
                continue
            new = chooser.add(step.width, taus)
            if new is not None:
                rates = chooser.rates()
                label = new if isinstance(new, str) else f"{new[0]} capped at {new[1]}"
                self._events.append(ControlRecord(
                    "policy", f"{label}: {rates[new] * self.pass_seconds(1):.2f}x a plain step's "
                    f"goodput over the last {len(chooser.samples)} steps (paired, "
                    f"z={chooser.z})", new[1] if isinstance(new, tuple) else None,
                    new[0] if isinstance(new, tuple) else None))
        self._open = keep

    def _gate(self, st: _ProposerState, cand: Draft | None,
              worth: bool) -> tuple[Literal["ok", "probe"] | None, str]:
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
        n_pass = (outcome.drafted + 1 if name else 1)
        if outcome.batch_rows:
            n_pass = max(n_pass, outcome.batch_rows)  # the time was the whole shared pass
        if outcome.verify_seconds > 0 and not self.deterministic:
            ratio = outcome.verify_seconds / self.cal.seconds(n_pass)
            ratio = min(max(ratio, 0.2), 5.0)
            if n_pass <= 1:
                self._scale_plain += 0.1 * (ratio - self._scale_plain)
            else:  # rarer: learn faster
                self._scale_verify += 0.25 * (ratio - self._scale_verify)
            if not outcome.batch_rows:  # a shared pass is not this size's price
                m = self._measured.get(n_pass)
                sec = outcome.verify_seconds
                self._measured[n_pass] = sec if m is None else m + 0.2 * (sec - m)
        for st in self._p.values():  # evidence fades per step, whoever drafted
            st.model.tick()
            if st.shared is not None:
                st.shared.tick()
        if name in self._p:
            self._observe_draft(name, outcome, view)
        shared = outcome.batch_rows > (outcome.drafted + 1 if name else 1)
        # the guard weighs one stream's speculative steps against its plain ones; a pass
        # shared with other sequences times the whole batch, which the load-aware rule in
        # decide() already prices, so it is no evidence either way
        if self.guard is not None and not shared:
            if name:
                rec = self.guard.observe_spec(self.slice, name, outcome.accepted + 1,
                                              outcome.draft_seconds + outcome.verify_seconds)
                if rec is not None:
                    self._events.append(rec)
            elif outcome.verify_seconds > 0:
                self.guard.observe_plain(self.slice, outcome.verify_seconds)
        self._view = view
        self._score_shadows(outcome, view)
        self._view = None
        if self.chooser is not None:
            self._view = view
            self._score_policies(self.chooser, outcome)
            self._view = None

    def _observe_draft(self, name: str, o: Outcome, view: StepView | None) -> None:
        st = self._p[name]
        st.last_evidence = self._step
        if st.costly and o.draft_seconds > 0 and not self.deterministic:
            per = o.draft_seconds / o.drafted
            if st.token_seconds is None:
                st.token_seconds = per
            else:  # a catch-up prefill after a long pause is not the per-token price
                st.token_seconds += 0.2 * (min(per, 3 * st.token_seconds) - st.token_seconds)
        verified = min(o.accepted + 1, o.drafted)
        st.run_best = max(st.run_best, o.accepted)
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
        if not st.fallback and self._below_floor(sum(w), len(w)):
            st.fallback = True
            st.fallback_step = self._step
            st.shadow_window.clear()
            self._events.append(ControlRecord(
                "fallback", f"{name}: acceptance {sum(w) / len(w):.0%} over the last {len(w)} "
                f"verified draft tokens is below the floor {self.floor:.0%}", 0, name))
            w.clear()

    def _below_floor(self, accepted: int, n: int) -> bool:
        s = self.settings
        if n >= s.floor_min:
            return accepted / n < self.floor
        # early: only when the rate is surely below it; the mean of a few positions would
        # bench a copy that starts with one miss
        return n >= s.floor_early and wilson_upper(accepted, n, s.floor_z) < self.floor

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
            st.run_best = max(st.run_best, j)
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

