"""Parity harness: does a speculative configuration say what the plain path says?

Greedy: run each prompt plain and speculative on one loaded engine; identical
tokens, or at the *first* divergence (later ones sit on different prefixes)
report the position, both tokens and the target's logits there in both runs:

* ``plain_margin`` / ``spec_margin``: top-1 minus top-2 logit in each run's row;
* ``pair_shift = (x_a - x_b)[plain row] + (y_b - y_a)[spec row]`` for the plain
  token a and the speculative token b: how far the batch moved the two logits
  relative to each other. If no logit moves by more than delta between the two
  runs, ``pair_shift <= 2 * delta``; so a divergence with
  ``pair_shift <= 2 * tolerance`` is **drift** (a near-tie that batch-dependent
  floating point can flip) and anything larger is a **defect**.
  ``tolerance`` defaults to 0.6 logits: the largest batch-induced change
  measured on Qwen 1.5B in the default mode was 0.595 (docs/parity.md); in an
  exact (batch-invariant) mode it must be 0, and every divergence is a defect.

Sampling: for each prompt, ``n_seeds`` plain runs and ``n_seeds`` speculative
runs on *disjoint* seeds (so the two samples are independent), compared with
chi-square homogeneity tests: the token at each of the first ``positions``
positions, and a position-mixed unigram profile (run r contributes its token at
position ``r mod positions``, which keeps the samples independent where pooling
every token of a run would not). All tests of one configuration share a
Bonferroni-corrected level, so a correct configuration is flagged with
probability at most ``alpha`` (the stated false-alarm rate).
``broken_acceptance()`` swaps in verification without the residual correction,
so the harness can show it detects a wrong sampler.
"""
from __future__ import annotations

import contextlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ...decoding import verify
from ..bench.prompts import SPEC_BENCH_FILE, default_data_dir
from ...errors import InvalidInputError
from ...api.events import TokenLogprob
from ...api.params import GenerationParams, SamplingParams
from .stattests import homogeneity

PLAIN = "none"
DEFAULT_TOLERANCE = 0.6
TOP_N = 8  # logprob alternatives requested per token: enough to hold both diverging tokens
END = -1  # category for "the run had ended before this position"


@dataclass(frozen=True)
class ParityPrompt:
    id: str
    category: str
    prompt: str


@dataclass(frozen=True)
class Divergence:
    position: int  # index among generated tokens
    plain_token: int
    spec_token: int
    plain_margin: float  # top-1 minus top-2 logit, plain run's row
    spec_margin: float  # same in the speculative run's row
    pair_shift: float  # see module docstring; a lower bound when `bounded`
    bounded: bool  # one of the two tokens was outside the reported top-N
    kind: str  # "drift" | "defect"


@dataclass(frozen=True)
class GreedyOutcome:
    prompt_id: str
    category: str
    config: str
    n_plain: int
    n_spec: int
    divergence: Divergence | None
    drafted: int
    accepted: int
    # largest |logprob difference| of the same token at the same position before any
    # divergence: 0.0 means the target's rows were bitwise equal on both paths
    max_logprob_diff: float = 0.0

    @property
    def identical(self) -> bool:
        return self.divergence is None and self.n_plain == self.n_spec

    @property
    def bitwise(self) -> bool:
        return self.identical and self.max_logprob_diff == 0.0


@dataclass(frozen=True)
class SamplingOutcome:
    prompt_id: str
    category: str
    config: str
    n_seeds: int
    p_values: tuple[float, ...]  # one per position, then the unigram profile


@dataclass
class ConfigReport:
    """Everything measured for one speculative configuration."""

    config: str
    greedy: list[GreedyOutcome] = field(default_factory=list)
    sampling: list[SamplingOutcome] = field(default_factory=list)
    alpha: float = 1e-3

    @property
    def n_tests(self) -> int:
        return sum(len(s.p_values) for s in self.sampling)

    @property
    def min_p(self) -> float | None:
        ps = [p for s in self.sampling for p in s.p_values]
        return min(ps) if ps else None

    @property
    def sampling_ok(self) -> bool | None:
        """None without sampling runs; else whether no test fell below alpha / n_tests."""
        if not self.sampling:
            return None
        return self.min_p >= self.alpha / self.n_tests

    def counts(self) -> dict[str, int]:
        c = Counter("identical" if g.identical else (g.divergence.kind if g.divergence else "length")
                    for g in self.greedy)
        out = {k: c.get(k, 0) for k in ("identical", "drift", "defect", "length")}
        out["bitwise"] = sum(g.bitwise for g in self.greedy)
        return out

    def to_json(self) -> dict:
        return {
            "config": self.config,
            "greedy": {"counts": self.counts(),
                       "outcomes": [_outcome_json(g) for g in self.greedy]},
            "sampling": None if not self.sampling else {
                "alpha": self.alpha, "tests": self.n_tests, "min_p": self.min_p,
                "pass": self.sampling_ok,
                "outcomes": [{"prompt": s.prompt_id, "category": s.category, "seeds": s.n_seeds,
                              "p_values": list(s.p_values)} for s in self.sampling]},
        }


# --- prompts -------------------------------------------------------------------------------

def load_prompts(path: str | Path | None = None, per_category: int = 1,
                 limit: int | None = None) -> list[ParityPrompt]:
    """The first ``per_category`` prompts of every category (file order), from a JSONL file.

    Each line needs ``prompt`` (a string) or ``turns`` (the first turn is used);
    ``category`` and ``question_id``/``id`` are optional. The default is the
    Spec-Bench file (13 categories) from the shipped data folder.
    """
    p = Path(path) if path is not None else default_data_dir() / SPEC_BENCH_FILE
    if not p.is_file():
        raise InvalidInputError(f"prompt file not found: {p}; pass --prompts FILE.jsonl")
    taken: dict[str, int] = defaultdict(int)
    out: list[ParityPrompt] = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"{p}:{n}: not JSON ({e.msg})") from None
            text = rec.get("prompt") if isinstance(rec, dict) else None
            if text is None and isinstance(rec, dict) and rec.get("turns"):
                text = rec["turns"][0]
            if not isinstance(text, str) or not text.strip():
                raise InvalidInputError(f"{p}:{n}: needs a non-empty 'prompt' or 'turns' field")
            cat = str(rec.get("category", "default"))
            if taken[cat] >= per_category:
                continue
            taken[cat] += 1
            out.append(ParityPrompt(str(rec.get("question_id", rec.get("id", n))), cat, text))
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise InvalidInputError(f"{p} holds no prompts")
    return out


# --- greedy ----------------------------------------------------------------------------------

def first_divergence(plain: Sequence[int], spec: Sequence[int],
                     plain_lp: Sequence[TokenLogprob], spec_lp: Sequence[TokenLogprob],
                     tolerance: float = DEFAULT_TOLERANCE) -> Divergence | None:
    """The first position where two greedy runs disagree, with margins and a verdict."""
    for i, (a, b) in enumerate(zip(plain, spec)):
        if a == b:
            continue
        pm, pa, pb, p_in = _row_facts(plain_lp[i], a, b)
        sm, sb, sa, s_in = _row_facts(spec_lp[i], b, a)
        shift = (pa - pb) + (sb - sa)
        bounded = not (p_in and s_in)
        # a bounded shift is a lower bound; a token outside the top-N is far from a tie
        kind = "drift" if (not bounded and shift <= 2 * tolerance) else "defect"
        return Divergence(i, int(a), int(b), pm, sm, shift, bounded, kind)
    return None


NEAR_TIE = "near-tie"
DEFECT = "defect"


def attribute_divergence(plain: Sequence[int], spec: Sequence[int],
                         plain_lp: Sequence[TokenLogprob], *, exact: bool,
                         tolerance: float = DEFAULT_TOLERANCE) -> dict | None:
    """Why a speculative run's greedy output left the plain path's, from the plain run alone.

    At the first differing position i the plain row ranks the plain token a above the
    speculative token b by ``gap = x_a - x_b``. The speculative run chose b, so in its row
    ``y_b >= y_a`` and the pair shift (module docstring) is at least ``gap``: a gap above
    ``2 * tolerance`` cannot be batch noise (a **defect**); below it the two tokens were a
    **near-tie** that batch-dependent floating point can flip. In exact mode any divergence
    breaks the promise and is a defect. A token outside the plain row's top-N is far from a
    tie. None when the runs agree on their common length.
    """
    for i, (a, b) in enumerate(zip(plain, spec)):
        if a == b:
            continue
        if i >= len(plain_lp):
            return {"position": i, "plain_token": int(a), "spec_token": int(b), "gap": None,
                    "top2_margin": None, "kind": DEFECT if exact else "unattributed",
                    "reason": "no plain logprobs at that position"}
        margin, la, lb, listed = _row_facts(plain_lp[i], a, b)
        gap = la - lb
        near = listed and not exact and gap <= 2 * tolerance
        return {"position": i, "plain_token": int(a), "spec_token": int(b),
                "gap": float(gap), "gap_is_bound": not listed, "top2_margin": float(margin),
                "threshold": 2 * tolerance, "kind": NEAR_TIE if near else DEFECT}
    return None


def logprob_drift(plain_lp: Sequence[TokenLogprob], spec_lp: Sequence[TokenLogprob],
                  div: Divergence | None) -> float:
    """Largest |logprob difference| over the shared prefix (the same token at the same position)."""
    n = min(len(plain_lp), len(spec_lp), div.position if div is not None else len(plain_lp))
    diffs = [abs(a.logprob - b.logprob) for a, b in zip(plain_lp[:n], spec_lp[:n])]
    return max(diffs, default=0.0)


def _row_facts(lp: TokenLogprob, chosen: int, other: int) -> tuple[float, float, float, bool]:
    """(top-1 minus top-2, logprob of chosen, logprob of other or a bound, other was listed)."""
    top = dict(lp.top)
    vals = sorted(top.values(), reverse=True)
    margin = vals[0] - vals[1] if len(vals) > 1 else float("inf")
    mine = top.get(chosen, lp.logprob)
    if other in top:
        return margin, mine, top[other], True
    return margin, mine, (vals[-1] if vals else mine), False


def greedy_parity(engine, prompts: Sequence[ParityPrompt], configs: Sequence[str], *,
                  max_tokens: int = 64, tolerance: float = DEFAULT_TOLERANCE,
                  params: GenerationParams | None = None) -> Iterator[GreedyOutcome]:
    """Plain vs each configuration at temperature 0, one prompt at a time (yields as it goes)."""
    base = params or GenerationParams()
    gp = GenerationParams(max_tokens=max_tokens, stop=base.stop, chat=base.chat, system=base.system,
                          sampling=SamplingParams(**{**_fields(base.sampling), "temperature": 0.0}),
                          logprobs=TOP_N)
    for pr in prompts:
        plain = engine.generate(pr.prompt, gp, proposer=PLAIN)
        for cfg in configs:
            spec = engine.generate(pr.prompt, gp, proposer=cfg)
            div = first_divergence(plain.tokens, spec.tokens, plain.logprobs, spec.logprobs, tolerance)
            yield GreedyOutcome(pr.id, pr.category, cfg, len(plain.tokens), len(spec.tokens), div,
                                spec.stats.drafted, spec.stats.accepted,
                                logprob_drift(plain.logprobs, spec.logprobs, div))


# --- sampling ----------------------------------------------------------------------------------

def compare_samples(plain: Sequence[Sequence[int]], spec: Sequence[Sequence[int]],
                    positions: int) -> tuple[float, ...]:
    """p-values: homogeneity of the token at each position, then the position-mixed unigram profile."""
    ps = []
    for j in range(positions):
        ps.append(_homogeneity_p([_at(s, j) for s in plain], [_at(s, j) for s in spec]))
    ps.append(_homogeneity_p([_at(s, r % positions) for r, s in enumerate(plain)],
                             [_at(s, r % positions) for r, s in enumerate(spec)]))
    return tuple(ps)


def _at(seq: Sequence[int], j: int) -> int:
    return int(seq[j]) if j < len(seq) else END


def _homogeneity_p(a: Iterable[int], b: Iterable[int]) -> float:
    ca, cb = Counter(a), Counter(b)
    cats = sorted(set(ca) | set(cb))
    return homogeneity([ca[c] for c in cats], [cb[c] for c in cats]).p_value


def sampling_parity(engine, prompts: Sequence[ParityPrompt], configs: Sequence[str],
                    sampling: SamplingParams, *, n_seeds: int = 100, positions: int = 4,
                    seed0: int = 0, chat: bool = True) -> Iterator[SamplingOutcome]:
    """Plain vs each configuration at the given sampling settings, disjoint seeds per path."""
    def runs(pr, proposer, offset):
        out = []
        for s in range(n_seeds):
            sp = SamplingParams(**{**_fields(sampling), "seed": seed0 + offset + s})
            gp = GenerationParams(max_tokens=positions, sampling=sp, chat=chat)
            out.append(engine.generate(pr.prompt, gp, proposer=proposer).tokens)
        return out

    for pr in prompts:
        plain = runs(pr, PLAIN, 0)
        for i, cfg in enumerate(configs, 1):
            spec = runs(pr, cfg, i * 1_000_003)
            yield SamplingOutcome(pr.id, pr.category, cfg, n_seeds, compare_samples(plain, spec, positions))


@contextlib.contextmanager
def broken_acceptance():
    """Within this block verification forgets the residual correction (a deliberate bug)."""
    original = verify.verify_sampling

    def broken(*args, **kwargs):
        kwargs["residual"] = False
        return original(*args, **kwargs)

    verify.verify_sampling = broken
    try:
        yield
    finally:
        verify.verify_sampling = original


def _fields(sp: SamplingParams) -> dict:
    return {f: getattr(sp, f) for f in sp.__dataclass_fields__}


def _outcome_json(g: GreedyOutcome) -> dict:
    d = {"prompt": g.prompt_id, "category": g.category, "plain_tokens": g.n_plain,
         "spec_tokens": g.n_spec, "identical": g.identical, "bitwise": g.bitwise,
         "max_logprob_diff": g.max_logprob_diff, "drafted": g.drafted, "accepted": g.accepted}
    if g.divergence is not None:
        d["divergence"] = g.divergence.__dict__.copy()
    return d
