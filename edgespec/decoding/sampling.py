"""From the target's logits to the distribution plain sampling draws from.

Both decoding paths call these functions, so the speculative path verifies
against exactly the distribution the plain path samples from (see verify.py).

Processing follows llama.cpp's default sampler chain (``common_params_sampling``
in ``common/common.h``), with the stages this project supports, in this order:

1. logit bias (``logit += bias``; ``-inf`` bans a token),
2. penalties over the last ``repeat_last_n`` tokens of the history:
   repetition (a seen token's logit is divided by the penalty when positive,
   multiplied when <= 0), then ``- count * frequency - [count > 0] * presence``,
3. top-k, 4. top-p, 5. min-p, 6. temperature, 7. softmax.

The order matters and is llama.cpp's, not Hugging Face's: temperature comes
*last*, so top-p and min-p select tokens by their temperature-1 probabilities
and temperature only reshapes the survivors. Users who move between
``llama-cli`` and edgespec get the same distribution for the same settings.

Penalties count the whole history (prompt and generated tokens) inside the
window, as llama-server does; ``repeat_last_n == 0`` disables all three
penalties, as in llama.cpp. Everything is computed in float64.

RNG policy
----------
Randomness is keyed by position, not by the order of draws: the token a request
generates at position ``n`` (0 = the first generated token) is drawn with the
uniform ``u(seed, n)`` of :class:`KeyedUniforms` (a counter-based derivation, one
``SeedSequence`` per position), whatever happened before it. A request without a
seed gets a fresh random seed once, at its start. Consequences:

* every emitted token is the inverse-CDF draw ``sample_at(p_n, u(seed, n))`` of the
  target's distribution at ``n``, on the plain path and the speculative one alike, so
  for the same seed and bitwise-equal logits the two paths emit the same tokens,
  whatever the controller drafted, with which proposer, how long, in which passes;
* point-mass drafts (n-gram, suffix, bridged, grammar literals) are accepted iff they
  equal that draw (verify.py);
* a draft model is *coupled* to the target: it draws its token at ``n`` from its own
  distribution with the same ``u(seed, n)``, and the token is accepted iff it equals
  the target's draw (a point mass to ``verify.verify_sampling``). That is lossless trivially (the
  emitted token is always the target's own draw) and it accepts where the two
  inverse-CDF intervals of the token overlap: when q is close to p that is close to
  rejection sampling's ``sum min(p, q)``, below it otherwise (docs/parity.md has the
  measured figures). Rejection sampling (``verify_sampling`` with draft
  distributions) consumes a varying number of uniforms, so where a drafter still
  hands distributions (the learned heads), each step draws from its own stream keyed
  by (seed, the step's first position): deterministic, independent of the
  position-keyed stream, and lossless, but then the text depends on the drafts;
* ``make_rng(seed, stream)`` remains for callers outside a request (a head drafter's
  own sampling, ``apps.lowlevel``).
"""
from __future__ import annotations

import threading
from typing import Protocol, Sequence

import numpy as np

from ..api.params import SamplingParams

# top-p first sorts only this many best candidates; enough for any peaked
# distribution, and it widens to a full sort when the mass is not reached.
_TOP_P_FIRST_CUT = 256

# sample() scans block sums first, then one block of this many tokens
_SAMPLE_BLOCK = 1024

_STREAMS = {"target": 0, "draft": 1, "step": 2}

_U53 = 1.0 / 9007199254740992.0  # 2**-53: a 53-bit integer onto [0, 1)


class Uniforms(Protocol):
    """What a draw consumes: ``random()`` in [0, 1) (a numpy Generator, or a cursor over
    position-keyed uniforms)."""

    def random(self) -> float: ...


class KeyedUniforms:
    """One request's uniforms by position: ``at(n)`` is a pure function of (seed, n).

    ``seed=None`` draws a fresh seed once (non-reproducible by design); :attr:`seed` then
    says which, so a draft model can be coupled to the same uniforms.
    """

    def __init__(self, seed: int | None) -> None:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
        self.seed = int(seed)

    def at(self, n: int, stream: str = "target") -> float:
        """The uniform of generated position ``n`` (one per position and stream)."""
        if n < 0:
            raise ValueError(f"position {n} is before the first generated token")
        seq = np.random.SeedSequence(self.seed, spawn_key=(_STREAMS[stream], n))
        return float(int(seq.generate_state(1, np.uint64)[0]) >> 11) * _U53

    def cursor(self, n: int) -> "Cursor":
        """Uniforms ``at(n), at(n + 1), ...`` one per ``random()``: for code that draws one
        uniform per emitted token, in order (plain steps, point-mass verification)."""
        return Cursor(self, n)

    def step(self, n: int) -> np.random.Generator:
        """An independent generator for a step starting at position ``n`` whose draws are
        not one per position (rejection sampling with draft distributions)."""
        seq = np.random.SeedSequence(self.seed, spawn_key=(_STREAMS["step"], n))
        return np.random.Generator(np.random.PCG64(seq))


class Cursor:
    """Position-keyed uniforms read in order (see :meth:`KeyedUniforms.cursor`)."""

    def __init__(self, keys: KeyedUniforms, n: int) -> None:
        self.keys, self.position = keys, n

    def random(self) -> float:
        u = self.keys.at(self.position)
        self.position += 1
        return u

_local = threading.local()


def make_rng(seed: int | None, stream: str = "target") -> np.random.Generator:
    """The generator for one request's ``stream`` ("target" or "draft").

    ``seed=None`` draws fresh OS entropy (non-reproducible by design).
    """
    if stream not in _STREAMS:
        raise ValueError(f"unknown RNG stream {stream!r}; use one of {sorted(_STREAMS)}")
    seq = np.random.SeedSequence(seed, spawn_key=(_STREAMS[stream],))
    return np.random.Generator(np.random.PCG64(seq))


def process_logits(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """Logit bias, then repetition/frequency/presence penalties; a float64 copy."""
    out = np.array(logits, dtype=np.float64, copy=True)
    if params.logit_bias:
        ids = np.fromiter((t for t, _ in params.logit_bias), dtype=np.int64, count=len(params.logit_bias))
        bias = np.fromiter((b for _, b in params.logit_bias), dtype=np.float64, count=len(params.logit_bias))
        np.add.at(out, ids, bias)  # a token listed twice gets both biases, as in llama.cpp
    if params.has_penalties and params.repeat_last_n > 0 and len(history) > 0:
        window = np.asarray(history[-params.repeat_last_n:], dtype=np.int64)
        ids, counts = np.unique(window, return_counts=True)
        seen = out[ids]
        seen = np.where(seen <= 0.0, seen * params.repeat_penalty, seen / params.repeat_penalty)
        seen -= counts * params.frequency_penalty + params.presence_penalty
        out[ids] = seen
    return out


def greedy_logits(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """What greedy choice takes the argmax of: the logits themselves when no bias or penalty
    applies (no copy on the hot path), else the processed copy."""
    if not params.logit_bias and not params.has_penalties:
        return logits
    return process_logits(logits, history, params)


def greedy_token(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> int:
    """argmax of the processed logits (lowest id wins a tie)."""
    return int(np.argmax(greedy_logits(logits, history, params)))


def distribution(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """The float64 distribution over the whole vocabulary the next token is drawn from.

    Greedy settings (temperature 0) give a point mass on ``greedy_token``.
    """
    x = process_logits(logits, history, params)
    m = x.max()
    if not np.isfinite(m):
        raise ValueError("every token is banned (all processed logits are -inf)")
    # the output reuses x's buffer: a second fresh 1.2 MB array per call costs
    # more in page faults than all the arithmetic here
    if params.greedy:
        best = int(np.argmax(x))
        x.fill(0.0)
        x[best] = 1.0
        return x

    keep = _truncate(x, params)
    if keep is None:  # nothing truncated: softmax in place over the whole vocabulary
        x -= m
        x /= params.temperature
        np.exp(x, out=x)
        x /= x.sum()
        return x
    z = (x[keep] - m) / params.temperature
    np.exp(z, out=z)
    x.fill(0.0)
    x[keep] = z / z.sum()
    return x


def sample(probs: np.ndarray, rng: Uniforms) -> int:
    """Inverse-CDF draw with exactly one ``rng.random()``; ``probs`` need not be normalised."""
    return sample_at(probs, float(rng.random()))


def sample_at(probs: np.ndarray, u: float) -> int:
    """The inverse-CDF draw of ``probs`` (need not be normalised) at the uniform ``u``.

    Two levels (block sums, then one block) because a float64 cumsum over a
    150k vocabulary costs more than everything else in a sampling step.
    """
    if not 0.0 <= u < 1.0:
        raise ValueError(f"a uniform must lie in [0, 1) (got {u})")
    n = probs.shape[0]
    if n <= 4 * _SAMPLE_BLOCK:
        return _icdf(probs, u * probs.sum())
    starts = np.arange(0, n, _SAMPLE_BLOCK)
    cum_blocks = np.cumsum(np.add.reduceat(probs, starts))
    target = u * cum_blocks[-1]
    j = min(int(np.searchsorted(cum_blocks, target, side="right")), len(starts) - 1)
    while cum_blocks[j] <= (cum_blocks[j - 1] if j else 0.0):
        j -= 1  # rounding put u on an empty block's edge: step back to one with mass
    below = cum_blocks[j - 1] if j else 0.0
    return int(starts[j]) + _icdf(probs[starts[j]: starts[j] + _SAMPLE_BLOCK], target - below)


def _icdf(probs: np.ndarray, target: float) -> int:
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, target, side="right"))
    if i >= cdf.shape[0] or probs[i] <= 0.0:
        i = int(np.flatnonzero(probs > 0.0)[-1])  # target rounded onto the total
    return i


def _truncate(x: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """Ids surviving top-k -> top-p -> min-p (llama.cpp order), or None when none of them cut."""
    cand: np.ndarray | None = None  # None = the whole vocabulary
    if params.top_k > 0:
        n_live = int(np.isfinite(x).sum())
        if params.top_k < n_live:
            cand = _best(x, params.top_k)
    if params.top_p < 1.0:
        cand = _top_p(x, cand, params.top_p)
    if params.min_p > 0.0:
        pool = x if cand is None else x[cand]
        threshold = pool.max() + np.log(params.min_p)
        cand = np.flatnonzero(x >= threshold) if cand is None else cand[pool >= threshold]
    if cand is not None:
        cand = cand[np.isfinite(x[cand])]
    return cand


def _best(x: np.ndarray, m: int) -> np.ndarray:
    """Ids of the m best, sorted by (logit desc, id asc); ties at the cut keep the lower ids."""
    n = x.shape[0]
    if m >= n:
        return np.argsort(-x, kind="stable")
    # a value partition is several times cheaper than argpartition on 150k floats
    work = _scratch(x)
    work.partition(n - m)
    threshold = work[n - m]
    ids = np.flatnonzero(x >= threshold)  # ascending, so the stable sort breaks ties by id
    return ids[np.argsort(-x[ids], kind="stable")][:m]


def _top_p(x: np.ndarray, cand: np.ndarray | None, p: float) -> np.ndarray:
    """Shortest best-first prefix whose temperature-1 mass reaches p (the crossing token kept)."""
    pool = x if cand is None else x[cand]
    m = pool.max()
    total = _sum_exp(pool, m)
    if cand is not None:  # top-k output is already sorted
        return cand[: _cut(np.cumsum(np.exp(x[cand] - m)) / total, p)]
    n = x.shape[0]
    width = min(_TOP_P_FIRST_CUT, n)
    while True:
        best = _best(x, width)
        cum = np.cumsum(np.exp(x[best] - m)) / total
        if cum[-1] >= p or width >= n:
            return best[: _cut(cum, p)]
        width = min(width * 8, n)


def _sum_exp(v: np.ndarray, shift: float) -> float:
    """sum(exp(v - shift))."""
    tmp = _scratch(v)
    tmp -= shift
    np.exp(tmp, out=tmp)
    return float(tmp.sum())


def _scratch(v: np.ndarray) -> np.ndarray:
    """A per-thread reusable copy of v.

    Fresh vocabulary-sized temporaries are returned to the OS and page-fault
    again on every call, which costs more than the arithmetic on them.
    """
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape[0] < v.shape[0]:
        buf = _local.buf = np.empty(v.shape[0], dtype=np.float64)
    out = buf[: v.shape[0]]
    np.copyto(out, v)
    return out


def _cut(cum: np.ndarray, p: float) -> int:
    return min(int(np.searchsorted(cum, p, side="left")) + 1, int(cum.shape[0]))
