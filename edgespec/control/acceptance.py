"""How likely a proposer's draft tokens are to be accepted, from what it says about them.

A draft of d tokens whose positions are accepted with conditional probabilities
p_1..p_d (p_i: accepted given that every earlier one was) emits on average
E(d) = 1 + p_1 + p_1 p_2 + ... + p_1...p_d tokens (the 1 is the target's own token):
:func:`expected_tokens`. The p_i come from :class:`AcceptanceModel`: recency-weighted
acceptance counts per proposer, grouped by the token's :func:`token_features` (its
confidence band and match-length bucket), by whether the proposer's previous draft got
its first token right (acceptance comes in bursts) and by draft position, each level
shrunk towards the one above and the top towards a prior that is itself scaled by how
this request's text has compared with the priors so far. :class:`ControlMemory` keeps
an engine-wide copy to seed each request from earlier ones.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, NamedTuple, Sequence

#: a bucket of the acceptance model: a feature's key, then the state and position levels
Key = tuple[Hashable, ...]


class Feature(NamedTuple):
    key: Key  # bucket the token is counted in
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
    # Deep positions rarely collect enough evidence of their own (a long draft is verified
    # only where every earlier token was right), so their estimate leans on the feature's,
    # which first positions dominate: measured on Spec-Bench that over-promised positions
    # 3-5 (predicted ~0.8, accepted 0.65/0.50/0.43) and bought passes that did not pay.
    # Each position bucket therefore keeps accepted against predicted-by-the-level-above
    # across all features, with a long memory, and scales its shrinkage target by that.
    position_memory = 8.0  # the calibration fades this many times slower than the counts
    position_strength = 4.0  # predicted tokens of evidence before a bucket's ratio moves much

    def __init__(self, window: float = 16, strength: float = 6.0,
                 position_calibration: bool = True) -> None:
        self.position_calibration = position_calibration
        self.window = window
        self.decay = 1.0 - 1.0 / window
        self.strength = strength
        self._counts: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.records = 0
        self.weight = 0.0  # decayed number of drafts behind the counts
        # accepted vs prior-expected verified tokens: how this text compares with the priors
        self._seen = [0.0, 0.0]
        # per position bucket: accepted vs predicted by the (feature, state) level
        self._pos_cal: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self._pos_decay = 1.0 - 1.0 / (window * self.position_memory)

    def seeded_copy(self, window: float, max_weight: float,
                    position_calibration: bool = True) -> "AcceptanceModel":
        """A fresh model (memory ``window``) that starts from this one's evidence, worth
        at most ``max_weight`` drafts: an informed prior that the new request's own
        drafts soon outweigh."""
        m = AcceptanceModel(window, self.strength, position_calibration)
        f = min(1.0, max_weight / self.weight) if self.weight > 0 else 0.0
        for key, (a, n) in self._counts.items():
            if n * f > 1e-6:
                m._counts[key] = [a * f, n * f]
        m.weight = self.weight * f
        m._seen = [self._seen[0] * f, self._seen[1] * f]
        # a ratio, not a count: the engine's long-run calibration carries over whole
        for b, (a, pr) in self._pos_cal.items():
            m._pos_cal[b] = [a, pr]
        return m

    @staticmethod
    def _levels(i: int, f: Feature, state: bool | None) -> tuple[Key, Key, Key]:
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
        for c in self._pos_cal.values():
            c[0] *= self._pos_decay
            c[1] *= self._pos_decay
        self.weight = self.weight * self.decay + 1.0

    def add(self, i: int, f: Feature, ok: bool, state: bool | None = None) -> None:
        """One verified token: draft position ``i``, accepted or not."""
        if self.position_calibration:
            c = self._pos_cal[_position_bucket(i)]
            c[0] += ok
            c[1] += self._upper(f, state, self._ratio())
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

    def _ratio(self) -> float:
        # scale every prior by how this request's text has compared with them so far, so a
        # bucket with no evidence yet still reflects that the text copies its input or not
        a, e = self._seen
        return (a + self.rescale_strength) / (e + self.rescale_strength) if self.rescale else 1.0

    def _shrunk(self, key: Key, p: float, less: Key | None = None) -> float:
        """The level ``key``'s estimate shrunk towards ``p``; with ``less`` (a child level,
        whose tokens are a subset of this one's) only the tokens outside the child count.

        Every token is counted at all three levels, so shrinking the child towards its
        parent's full estimate counted it two or three times: three fully accepted tokens
        at prior 0.35 came out at 0.81 instead of 0.57, and five copying steps made a deep
        position look certain. The parent's estimate without the child's tokens, as the
        child's prior, counts each token once."""
        a, n = self._counts.get(key, (0.0, 0.0))
        if less is not None:
            ca, cn = self._counts.get(less, (0.0, 0.0))
            a, n = max(a - ca, 0.0), max(n - cn, 0.0)
        return (a + self.strength * p) / (n + self.strength)

    def _upper(self, f: Feature, state: bool | None, ratio: float,
               less: Key | None = None) -> float:
        """The estimate from the feature and state levels, before the position's own
        (with ``less``, the position level's tokens left out of the state level)."""
        p = min(max(f.prior * ratio, 0.02), 0.95)
        return self._shrunk((f.key, state), self._shrunk((f.key,), p, less=(f.key, state)),
                            less=less)

    def position_factor(self, i: int) -> float:
        """Accepted over predicted at draft position ``i``, across features (1.0: no evidence)."""
        if not self.position_calibration:
            return 1.0
        a, pr = self._pos_cal.get(_position_bucket(i), (0.0, 0.0))
        k = self.position_strength
        return (a + k) / (pr + k)

    def predict(self, features: Sequence[Feature], state: bool | None = None) -> list[float]:
        ratio = self._ratio()
        out = []
        for i, f in enumerate(features):
            pos = (f.key, state, _position_bucket(i))
            p = min(self._upper(f, state, ratio, less=pos) * self.position_factor(i), 0.99)
            p = self._shrunk(pos, p)
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

    def seed(self, proposer: str, window: float, position_calibration: bool = True) -> AcceptanceModel:
        return self.model(proposer).seeded_copy(window, self.seed_weight, position_calibration)


def wilson_upper(accepted: int, n: int, z: float) -> float:
    """The upper Wilson score bound of a rate seen as ``accepted`` of ``n`` (1.0 when n = 0).

    Unlike the normal approximation it stays inside [0, 1] and is honest at small n: 0 of
    6 gives 0.21 at z = 1.28, 2 of 6 gives 0.59, so a handful of rejections can already
    show a rate below a 0.6 floor while 3 of 6 cannot."""
    if n <= 0:
        return 1.0
    p = accepted / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z2 / n))
