"""Choosing between whole policies on realized goodput: the adaptive controller, fixed
draft caps of each free proposer (the short cap is what ``--exact`` runs), and the plain
path.

Every step the engine hands the controller every free proposer's candidate, and the
tokens the target then emits say how many of each candidate's tokens it would have taken.
So at each step every policy's counterfactual is known without running it: a cap k of
proposer P would have verified min(k, |candidate|) drafts and emitted min(k, matched) + 1
tokens, in the measured time of a pass of that size. A policy's goodput is its tokens over
its seconds; over the positions of the text that is the inverse of the mean seconds per
token of the step starting there, so each step's seconds-per-token of every policy is
weighted by the tokens the step really emitted (the positions it stands for). Comparisons
are paired (all policies scored on the same steps), which removes the text's own
variation, and the incumbent yields only when a challenger's seconds per token are lower
by more than ``z`` standard errors: a cap it could have chosen cannot keep beating it.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Literal, Mapping, Sequence, Union

#: fixed caps scored as live candidates for each free proposer
CAPS = (1, 2, 3, 4, 8)
ADAPTIVE: Literal["adaptive"] = "adaptive"
PLAIN: Literal["plain"] = "plain"
#: a policy: the adaptive controller, the plain path, or (proposer, cap) drafting at most cap
Policy = Union[Literal["adaptive", "plain"], tuple[str, int]]


class PolicyChooser:
    """Paired, token-weighted comparison of policies' seconds per token over a window."""

    def __init__(self, policies: Sequence[Policy], window: int = 64, z: float = 1.645,
                 min_samples: int = 6, incumbent: Policy = ADAPTIVE) -> None:
        self.policies = policies
        self.z = z
        self.min_samples = min_samples
        self.current = incumbent
        self.samples: deque[tuple[float, Mapping[Policy, float]]] = deque(maxlen=window)
        self.switches = 0

    def add(self, weight: float, seconds_per_token: Mapping[Policy, float]) -> Policy | None:
        """One step's (tokens it emitted, {policy: seconds per token}); returns the new
        incumbent when it changed."""
        self.samples.append((weight, seconds_per_token))
        if len(self.samples) < self.min_samples:
            return None
        inc = self.current
        best: Policy | None = None
        best_lower = 0.0
        for c in self.policies:
            if c == inc:
                continue
            sw = sd = 0.0
            diffs = []
            for w, tau in self.samples:
                d = tau[inc] - tau[c]
                diffs.append((w, d))
                sw += w
                sd += w * d
            m = sd / sw
            var = sum(w * w * (d - m) ** 2 for w, d in diffs) / (sw * sw)
            lower = m - self.z * math.sqrt(var)
            if lower > best_lower:
                best, best_lower = c, lower
        if best is None:
            return None
        self.current = best
        self.switches += 1
        return best

    def rates(self) -> dict[Policy, float]:
        """Each policy's estimated goodput (tokens per second) over the window."""
        sw = sum(w for w, _ in self.samples)
        return {p: sw / sum(w * tau[p] for w, tau in self.samples) for p in self.policies} \
            if self.samples else {}
