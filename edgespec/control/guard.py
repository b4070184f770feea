"""The goodput guard: an engine-wide check, per traffic slice and proposer, that
speculation really pays against the plain steps it replaces."""
from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

from .settings import ControlRecord, ControlSettings


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
    over the threshold (each batch that fails doubles the spacing, up to 16 times).
    Until enough plain steps exist, the calibration's step time stands in for them.
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

