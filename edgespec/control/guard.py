"""The goodput guard: an engine-wide check, per traffic slice, that speculation really
pays against the plain path it replaces. It judges at two grains with one estimator and
one threshold (``ControlSettings.guard_threshold``, ``guard_z``):

* **steps** (per slice and proposer, inside requests): speculative steps' goodput against
  the plain steps the adaptive controller takes (or the calibration's step time);
* **requests** (per slice, the *canary*): with :class:`CanarySettings` set, a fraction of
  each slice's requests runs the plain path whatever it asked for (:meth:`route`), and
  their decode rate is the baseline the speculative requests' decode rate is measured
  against (:meth:`observe_request`). When the lower confidence bound of that improvement
  falls below the threshold, the slice's requests run plain (a ``canary_off`` record); a
  fraction keeps speculating as probes, and once they alone lift the bound back over the
  threshold speculation returns (``canary_on``). :meth:`canary_snapshot` is what a
  server's metrics endpoint exports.

    guard.configure_canary(CanarySettings(fraction=0.05))
    route = guard.route("chat", "ngram+suffix")     # Route(label="none", arm="canary", ...)
    ...                                             # run the request with route.label
    rec = guard.observe_request("chat", route, stats.decode_tokens, stats.decode_seconds)
"""
from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Literal, NamedTuple, Sequence, TypedDict

from ..api.labels import PLAIN, RouteArm
from ..errors import InvalidInputError
from .settings import ControlRecord, ControlSettings


# --- the one estimator ----------------------------------------------------------------------
class Goodput(NamedTuple):
    rate: float  # tokens per second over the samples (a ratio of sums)
    rel_var: float  # relative variance of that ratio (delta method)


def goodput(samples: Sequence[tuple[float, float]]) -> Goodput:
    """Tokens per second over (tokens, seconds) samples, and the relative variance of that
    ratio estimate: Var(r)/r^2 = sum((t_i - r s_i)^2) / ((n-1) n sbar^2 r^2). Plain steps are
    samples (1, seconds); requests are (decode tokens, decode seconds)."""
    n = len(samples)
    tok = [t for t, _ in samples]
    sec = [x for _, x in samples]
    tbar, sbar = sum(tok) / n, sum(sec) / n
    r = tbar / sbar
    if n < 2:
        return Goodput(r, math.inf)
    resid = sum((t - r * x) ** 2 for t, x in zip(tok, sec))
    return Goodput(r, resid / (n - 1) / n / (sbar * sbar) / (r * r))


def ratio_bound(spec: Goodput, plain: Goodput, z: float) -> tuple[float, float]:
    """(speedup, one-sided lower confidence bound) of speculative over plain goodput."""
    speedup = spec.rate / plain.rate
    return speedup, speedup - z * speedup * math.sqrt(spec.rel_var + plain.rel_var)


# --- the canary ---------------------------------------------------------------------------
def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInputError(message)


@dataclass(frozen=True)
class CanarySettings:
    """Request-level comparison against the plain path, per traffic slice."""

    fraction: float = 0.05  # of a slice's requests that run the plain path (the canary)
    min_requests: int = 16  # per arm (plain, speculative) before a slice is judged
    window: int = 128  # requests per arm remembered
    probe_fraction: float = 0.1  # while a slice is off: requests that still speculate
    seed: int | None = None  # the routing draw (None: different each run)

    def validate(self) -> "CanarySettings":
        _check(0.0 < self.fraction < 1.0,
               f"the canary fraction must be in (0, 1) (got {self.fraction}); it is the share "
               "of requests that run the plain path as the baseline")
        _check(0.0 < self.probe_fraction <= 1.0,
               f"the canary probe fraction must be in (0, 1] (got {self.probe_fraction})")
        _check(self.window >= self.min_requests >= 2,
               "canary window must be >= min_requests >= 2")
        return self


class Route(NamedTuple):
    """What a request runs. ``arm``: "speculative" (as asked), "canary" (plain, as the
    slice's baseline), "probe" (speculating while the slice is off), "held" (plain because
    the slice is off), or "direct" (no canary configured, or the plain path was asked)."""

    label: str
    arm: RouteArm
    reason: str = ""

    @property
    def plain_arm(self) -> bool:
        return self.arm in ("canary", "held")


class _CanaryState:
    def __init__(self, window: int) -> None:
        self.spec: deque[tuple[float, float]] = deque(maxlen=window)
        self.plain: deque[tuple[float, float]] = deque(maxlen=window)
        self.enabled = True
        self.fresh = 0  # speculative requests since the last judgement
        self.changes = 0


@dataclass(frozen=True)
class GuardEstimate:
    speedup: float  # speculative goodput × plain-step time (1.0 = break-even)
    lower: float  # lower confidence bound of that
    spec_steps: int
    plain_steps: int
    enabled: bool


#: the guard's answer for one step of a proposer: draft, draft as a probe, or not at all
Admission = Literal["on", "probe", "off"]


class GuardSnapshot(TypedDict):
    """One (slice, proposer) of :meth:`GoodputGuard.snapshot`."""

    enabled: bool
    speedup: float | None
    lower: float | None
    spec_steps: int
    plain_steps: int


class CanarySnapshot(TypedDict):
    """One traffic slice of :meth:`GoodputGuard.canary_snapshot` (a metrics endpoint's)."""

    enabled: bool
    improvement: float | None
    lower: float | None
    speculative_requests: int
    plain_requests: int
    changes: int
    threshold: float
    fraction: float | None


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
    over the threshold (each batch that fails doubles the spacing, up to 16 times).
    Until enough plain steps exist, the calibration's step time stands in for them.
    """

    def __init__(self, settings: ControlSettings | None = None,
                 plain_seconds_prior: float | None = None) -> None:
        self.settings = (settings or ControlSettings()).validate()
        self.plain_seconds_prior = plain_seconds_prior
        self._plain: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=self.settings.guard_window))
        self._slices: dict[tuple[str, str], _SliceState] = {}
        self.canary: CanarySettings | None = None
        self._canary: dict[str, _CanaryState] = {}
        self._rng = random.Random()

    # --- the canary (requests) ------------------------------------------------------------
    def configure_canary(self, settings: CanarySettings | None) -> None:
        """Turn the request-level canary on (settings) or off (None); forgets past evidence."""
        self.canary = settings.validate() if settings is not None else None
        self._canary.clear()
        self._rng = random.Random(settings.seed if settings is not None else None)

    def _cstate(self, slice_: str, c: CanarySettings) -> _CanaryState:
        st = self._canary.get(slice_)
        if st is None:
            st = self._canary[slice_] = _CanaryState(c.window)
        return st

    def route(self, slice_: str, label: str) -> Route:
        """The canary decision for one request of ``slice_`` that asked for ``label``."""
        c = self.canary
        if c is None or label == PLAIN:
            return Route(label, "direct")
        st = self._cstate(slice_, c)
        draw = self._rng.random()
        if st.enabled:
            if draw < c.fraction:
                return Route(PLAIN, "canary", f"plain path: the {c.fraction:.0%} canary of "
                             f"traffic slice {slice_!r} (baseline for {label})")
            return Route(label, "speculative")
        if draw < c.probe_fraction:
            return Route(label, "probe", f"{label} probes traffic slice {slice_!r}, where "
                         "speculation is off until probes show a gain")
        return Route(PLAIN, "held", f"plain path: speculation is off for traffic slice "
                     f"{slice_!r} (the canary measured no gain)")

    def observe_request(self, slice_: str, route: Route, tokens: int,
                        seconds: float) -> ControlRecord | None:
        """Record a finished request's decode rate (decode tokens, decode seconds) in its
        arm; returns the record of a change of the slice's mode, if any."""
        c = self.canary
        if c is None or route.arm == "direct" or tokens <= 0 or seconds <= 0:
            return None
        st = self._cstate(slice_, c)
        if route.plain_arm:
            st.plain.append((tokens, seconds))
            return None
        if route.arm == "speculative" and not st.enabled:
            return None  # routed before the slice was switched off: not probe evidence
        st.spec.append((tokens, seconds))
        st.fresh += 1
        need = c.min_requests
        if len(st.spec) < need or len(st.plain) < need or st.fresh < (
                max(need // 4, 1) if st.enabled else need):
            return None
        st.fresh = 0
        speedup, lower = self._canary_bound(st)
        threshold = self.settings.guard_threshold
        where = f"traffic slice {slice_!r}"
        if st.enabled and lower < threshold:
            st.enabled = False
            st.spec.clear()
            st.changes += 1
            return ControlRecord(
                "canary_off", f"{where}: speculative requests decode at {speedup:.2f}x the plain "
                f"canary, lower bound {lower:.2f} < {threshold:.2f}; the slice runs the plain path "
                f"({c.probe_fraction:.0%} of requests keep probing)", proposer=route.label)
        if not st.enabled and lower < threshold:
            st.spec.clear()  # the probes did not show a gain: judge a fresh batch
            return None
        if not st.enabled:
            st.enabled = True
            st.changes += 1
            return ControlRecord(
                "canary_on", f"{where}: probes decode at {speedup:.2f}x the plain path, lower "
                f"bound {lower:.2f} >= {threshold:.2f}; speculation is back on",
                proposer=route.label)
        return None

    def _canary_bound(self, st: _CanaryState) -> tuple[float, float]:
        return ratio_bound(goodput(st.spec), goodput(st.plain), self.settings.guard_z)

    def canary_snapshot(self) -> dict[str, CanarySnapshot]:
        """Per traffic slice: whether speculation is on, the goodput improvement over the
        plain canary and its lower confidence bound (None until both arms have two
        requests), request counts and the settings, for a metrics endpoint."""
        out: dict[str, CanarySnapshot] = {}
        for sl, st in self._canary.items():
            speedup: float | None = None
            lower: float | None = None
            if len(st.spec) >= 2 and len(st.plain) >= 2:
                speedup, lower = self._canary_bound(st)
            out[sl] = {"enabled": st.enabled, "improvement": speedup, "lower": lower,
                       "speculative_requests": len(st.spec), "plain_requests": len(st.plain),
                       "changes": st.changes, "threshold": self.settings.guard_threshold,
                       "fraction": self.canary.fraction if self.canary else None}
        return out

    # --- steps ------------------------------------------------------------------------------

    def _state(self, slice_: str, proposer: str) -> _SliceState:
        key = (slice_, proposer)
        st = self._slices.get(key)
        if st is None:
            st = self._slices[key] = _SliceState(self.settings.guard_window)
        return st

    def admits(self, slice_: str, proposer: str) -> Admission:
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
        prior = self.plain_seconds_prior
        if n < 2:
            return None
        if m >= 2:
            plain_rate = goodput([(1, x) for x in plain])
        elif prior is not None:
            # one calibration number standing in for plain steps: trust it loosely
            plain_rate = Goodput(1.0 / prior, 0.15 ** 2)
        else:
            return None
        speedup, lower = ratio_bound(goodput(st.spec), plain_rate, self.settings.guard_z)
        return GuardEstimate(speedup, lower, n, m, st.enabled)

    def snapshot(self) -> dict[str, GuardSnapshot]:
        """Per "slice/proposer": enabled, speedup, lower bound, step counts (for stats and the TUI)."""
        out: dict[str, GuardSnapshot] = {}
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

