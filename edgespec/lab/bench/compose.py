"""The matrix a command line asks for: preset, then a TOML file, then flags.

The CLI passes the flags through unchanged; every rule about how they combine lives here,
so `edgespec bench`, `edgespec qualify` and a script build the same matrix the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from ...errors import InvalidInputError
from . import matrix as mx
from . import presets
from .prompts import HUMANEVALFIX, SPEC_BENCH_CATEGORIES


@dataclass(frozen=True)
class Flags:
    """What `edgespec bench` was given; None means "not given" (the preset or file decides)."""

    preset: str = "quick"
    matrix_file: str | None = None
    proposers: Sequence[str] = ()
    anchors: Sequence[str] = ()
    no_anchor: bool = False
    categories: str | None = None
    jsonl: Sequence[str] = ()
    buckets: str | None = None
    long: str | None = None
    scalars: tuple[tuple[str, Any], ...] = ()  # Matrix fields set by flags (max_new_tokens=...)


def ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InvalidInputError(f"{what} must be comma-separated whole numbers (got {text!r})") from None


def compose(f: Flags) -> mx.Matrix:
    if f.no_anchor and f.anchors:
        # --anchor already replaces the preset's anchors; both at once dropped the ones asked
        raise InvalidInputError("--no-anchor leaves the preset's anchors out and --anchor "
                                "replaces them: give one or the other")
    base = presets.preset(f.preset)
    m = presets.load_toml(f.matrix_file, base=base) if f.matrix_file else base
    changes = {k: v for k, v in f.scalars if v is not None}
    if f.categories is not None:
        changes["spec_bench"] = mx.spec_bench_selection(f.categories)
    if f.jsonl:
        changes["jsonl"] = tuple(f.jsonl)
    if f.buckets is not None:
        changes["buckets"] = ints(f.buckets, "--buckets")
    if f.long is not None:
        changes["long"] = ints(f.long, "--long")
    m = replace(m, **changes)
    preset_engine = [c for c in base.configs if c.kind == "engine"]
    engine_configs = ([mx.parse_config(p) for p in f.proposers] if f.proposers
                      else [c for c in m.configs if c.kind == "engine"])
    if engine_configs == preset_engine and m.draft is None:
        # A preset lists "draft" for when a draft model is given; without one, leave it out.
        engine_configs = [c for c in engine_configs if c.proposer != "draft"]
    # an anchor's own plain path comes back through with_baseline()
    anchor_configs = ([] if f.no_anchor else [mx.ConfigSpec.anchor(a) for a in f.anchors] if f.anchors
                      else [c for c in m.configs if c.kind == mx.ANCHOR_KIND])
    if m.draft is None and not f.anchors:
        anchor_configs = [c for c in anchor_configs if c.proposer != "llama-speculative-simple"]
    m = replace(m, configs=tuple(engine_configs) + tuple(anchor_configs))
    if f.matrix_file or changes or f.proposers or f.anchors or f.no_anchor:
        m = replace(m, preset=f"{m.preset}, modified")
    return m.with_baseline().validate()


def qualification_matrix(pair, slices: str, *, per_slice: int, max_turns: int, max_tokens: int,
                         seed: int, threads: int | None, n_ctx: int | None) -> tuple[mx.Matrix, list[str]]:
    """The plain path and one registered pair's proposer, on the named workload slices."""
    names = [s.strip() for s in slices.split(",") if s.strip()]
    unknown = [s for s in names if s not in SPEC_BENCH_CATEGORIES and s != HUMANEVALFIX]
    if not names or unknown:
        raise InvalidInputError(f"unknown slice(s) {', '.join(unknown) or '(none given)'}; choose from "
                                f"{', '.join((*SPEC_BENCH_CATEGORIES, HUMANEVALFIX))}")
    m = mx.Matrix(
        target=pair.target, draft=pair.draft,
        configs=(mx.ConfigSpec(mx.BASELINE), mx.ConfigSpec(pair.proposer)),
        spec_bench=tuple(s for s in names if s != HUMANEVALFIX), per_category=per_slice,
        max_turns=max_turns, humanevalfix=per_slice if HUMANEVALFIX in names else 0,
        max_new_tokens=max_tokens, seed=seed, threads=threads,
        n_ctx=n_ctx or mx.Matrix.n_ctx, preset="qualify").validate()
    return m, names
