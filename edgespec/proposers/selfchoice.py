"""Which layers a self-draft keeps: measured on this machine, recorded per target digest.

:func:`measure` runs candidate layer sets as self-drafts in a loaded engine, interleaved
with the plain path on calibration prompts, and records each candidate's acceptance and
decode speed against plain in the same run. :func:`chosen_layers` is what ``--proposer
self`` uses by default afterwards: the fastest candidate, when it beat the plain path.

    $EDGESPEC_HOME/calibration/self-<target sha256[:16]>.json
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import InvalidInputError
from ..paths import calibration_dir
from .layers import LayerSet, spread
from .selfspec import SelfDraftProposer, ensure_self_draft
from ..api.params import GenerationParams
from ..identity.digests import model_identity
import numpy as np

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from . import BuildContext

_FORMAT = 1
#: calibration prompts: an explanation, a code task, a rewrite (what drafts see most)
PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the mean of a list of numbers, then call it on "
    "[1, 2, 3].",
    "Rewrite this sentence in the passive voice: The committee approved the new budget "
    "after a long debate.",
)


@dataclass(frozen=True)
class Trial:
    layers: str  # LayerSet.key
    kept: int
    drafted: int
    accepted: int
    tok_s: float  # decode tokens/s with this self-draft (geomean over the prompts; 0: untimed)
    plain_tok_s: float  # the plain path's, interleaved with it
    #: share of the target's greedy tokens the draft predicts given the true prefix: what a
    #: greedy draft's first token is accepted at, independent of machine load
    agreement: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def speedup(self) -> float:
        return self.tok_s / self.plain_tok_s if self.plain_tok_s else 0.0


def record_path(target_sha: str) -> Path:
    return calibration_dir() / f"self-{target_sha[:16]}.json"


def candidates(n_layer: int) -> list[LayerSet]:
    """The first and last blocks with the middle skipped, at four depths."""
    keeps = sorted({max(2, round(n_layer * f)) for f in (0.25, 0.375, 0.5, 0.625)})
    return [LayerSet.of(spread(n_layer, k), n_layer) for k in keeps if k < n_layer]


def chosen_layers(target_sha: str | None, n_layer: int) -> LayerSet | None:
    """The recorded fastest layer set for this target, if it beat the plain path."""
    if not target_sha:
        return None
    try:
        rec = json.loads(record_path(target_sha).read_text())
        if rec.get("format") != _FORMAT or rec.get("chosen") is None:
            return None
        return LayerSet.parse(rec["chosen"], n_layer)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, InvalidInputError):
        return None  # nothing measured (or unreadable): the caller's default applies


def layers_for(target_sha: str | None, n_layer: int, layers_text: str = "") -> LayerSet:
    """The layers a self-draft keeps: ``layers_text`` when given, else the measured choice
    (`edgespec self-draft`), else half the blocks, the first and last kept."""
    if layers_text:
        return LayerSet.parse(layers_text, n_layer)
    return chosen_layers(target_sha, n_layer) or LayerSet.of(spread(n_layer, n_layer // 2), n_layer)


def build_self(ctx: BuildContext, layers_text: str, n_batch: int = 0) -> SelfDraftProposer:
    """The factory behind ``--proposer self`` (``ctx`` is the registry's BuildContext)."""
    if ctx.target is None or ctx.load_model is None:
        raise InvalidInputError("the self proposer drafts with the loaded target's layers; "
                                "it cannot be built without one")
    layers = layers_for(ctx.target_digest, int(ctx.target.n_layer), layers_text)
    path = ensure_self_draft(Path(ctx.target.path), ctx.target_digest or "nodigest", layers)
    model = ctx.load_model(path)
    try:
        return SelfDraftProposer(model, layers, n_ctx=ctx.n_ctx, n_threads=ctx.threads,
                                 n_batch=n_batch, kernel=ctx.kernel,
                                 target_vocab=ctx.target.n_vocab)
    except BaseException:
        model.close()
        raise


def measure(engine: Engine, layer_sets: Sequence[LayerSet], prompts: Sequence[str] = PROMPTS,
            max_tokens: int = 64, say: Callable[[str], None] | None = None,
            timed: bool = True) -> list[Trial]:
    """Each layer set as a self-draft, every prompt run plain then with it (interleaved),
    plus the draft's agreement with the plain output; ``timed=False`` measures agreement
    only (one plain run per prompt, shared by every candidate)."""
    from ..runtime.model import load_model  # deferred: it loads llama.cpp
    say = say or (lambda _m: None)
    target = engine.target
    sha = model_identity(Path(target.path))["sha256"]
    params = GenerationParams(max_tokens=max_tokens)
    plain_runs = {p: engine.generate(p, params, proposer="none") for p in prompts}
    trials = []
    n_ctx = engine.config.n_ctx
    if n_ctx is None:  # a built engine's config holds the context size it resolved
        raise InvalidInputError("measuring self-drafts needs a built engine")
    for ls in layer_sets:
        path = ensure_self_draft(Path(target.path), sha, ls, say)
        model = load_model(path)
        name = f"self[{ls.key}]"
        prop = SelfDraftProposer(model, ls, n_ctx=n_ctx,
                                 n_threads=engine.config.threads, kernel=engine.config.kernel,
                                 target_vocab=target.n_vocab)
        engine.add_proposer(name, prop)
        try:
            hits = [_agreement(prop, engine.prompt_tokens(p, params), plain_runs[p].tokens)
                    for p in prompts]
            spec_rates, plain_rates, drafted, accepted = [], [], 0, 0
            for prompt in prompts if timed else ():
                plain = engine.generate(prompt, params, proposer="none")
                spec = engine.generate(prompt, params, proposer=name)
                plain_rates.append(plain.stats.decode_tokens_per_second)
                spec_rates.append(spec.stats.decode_tokens_per_second)
                drafted += spec.stats.drafted
                accepted += spec.stats.accepted
        finally:
            engine.remove_proposer(name)
        agree = sum(h for h, _ in hits) / max(1, sum(n for _, n in hits))
        t = Trial(ls.key, len(ls.layers), drafted, accepted, _geomean(spec_rates),
                  _geomean(plain_rates), agreement=agree)
        say(f"layers {t.layers} ({t.kept}/{ls.n_layer}): agreement {agree:.0%}"
            + (f", acceptance {t.acceptance:.0%}, {t.speedup:.2f}x the plain path" if timed else ""))
        trials.append(t)
    return trials


def record(target_sha: str, trials: Sequence[Trial], trusted: bool) -> dict[str, Any]:
    """Write the measurement; the chosen set is the fastest one that beat plain, if any (and
    only from a trusted, quiet-machine run)."""
    best = max(trials, key=lambda t: t.speedup, default=None)
    chosen = best.layers if (best is not None and trusted and best.speedup > 1.0) else None
    rec = {"format": _FORMAT, "chosen": chosen, "trusted": trusted,
           "trials": [{**asdict(t), "acceptance": t.acceptance, "speedup": t.speedup}
                      for t in trials]}
    path = record_path(target_sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(tmp, path)
    return rec


def _agreement(prop: SelfDraftProposer, prompt: Sequence[int], output: Sequence[int]) -> tuple[int, int]:
    """(hits, positions): where the draft's greedy token, given the target's own prefix,
    is the target's greedy token (one batched draft pass over prompt + output)."""
    out = [int(t) for t in output]
    if not out or not prompt:
        return 0, 0
    ctx = prop.ctx
    ctx.clear()
    rows = ctx.decode(list(prompt) + out[:-1], 0, logits="all")[len(prompt) - 1:]
    ctx.clear()
    prop._held = []  # the draft's KV no longer holds an earlier request's prefix
    best = rows[:, :prop.target_vocab].argmax(axis=1)
    return int(np.sum(best == np.asarray(out))), len(out)


def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0
