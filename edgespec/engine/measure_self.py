"""Which layers a self-draft should keep, measured in a loaded engine (``edgespec
self-draft``): each candidate layer set runs as a self-draft, interleaved with the plain
path on calibration prompts, and the record says which one beat plain by most. The record
is read below the engine, by edgespec.proposers.self_draft_choice (``--proposer self``'s default)
and the planner; this module is the only writer.

    $EDGESPEC_HOME/calibration/self-<target sha256[:16]>.json
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..api.params import GenerationParams
from ..api.stats import geometric_mean
from ..errors import InvalidInputError
from ..registry.digests import model_identity
from ..proposers.self_draft_layers import LayerSet, spread
from ..proposers.self_draft_choice import FORMAT, Trial, record_path
from ..proposers.self_draft import SelfDraftProposer, ensure_self_draft
from ..statefile import atomic_write

if TYPE_CHECKING:
    from .engine import Engine

#: calibration prompts: an explanation, a code task, a rewrite (what drafts see most)
PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the mean of a list of numbers, then call it on "
    "[1, 2, 3].",
    "Rewrite this sentence in the passive voice: The committee approved the new budget "
    "after a long debate.",
)


def candidates(n_layer: int) -> list[LayerSet]:
    """The first and last blocks with the middle skipped, at four depths."""
    keeps = sorted({max(2, round(n_layer * f)) for f in (0.25, 0.375, 0.5, 0.625)})
    return [LayerSet.of(spread(n_layer, k), n_layer) for k in keeps if k < n_layer]


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
    rec = {"format": FORMAT, "chosen": chosen, "trusted": trusted,
           "trials": [{**asdict(t), "acceptance": t.acceptance, "speedup": t.speedup}
                      for t in trials]}
    # whole or not at all: a reader never sees half a record (edgespec.statefile)
    atomic_write(record_path(target_sha), json.dumps(rec, indent=1), what="self-draft record")
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
    """The geometric mean of the timed rates; 0.0 when none was timed (Trial's "untimed")."""
    timed = [x for x in xs if x > 0]
    return geometric_mean(timed) if timed else 0.0
