"""The named workloads of `edgespec bench --preset`.

    quick     1 prompt per Spec-Bench category (first turn) + 2 HumanEvalFix, 64 tokens;
              plain, ngram, suffix, llama-cpp-python's prompt lookup (and its own plain path).
              About 10 minutes on 2 cores with Qwen 1.5B.
    standard  3 prompts per category (first turn) + 10 HumanEvalFix, 128 tokens; plain, the
              default (auto), the default with --exact, llama.cpp's llama-completion and
              llama-lookup (`make anchors`). 49 units x 5 requests: under about an hour.
    long      grounded prompts of about 2k, 4k and 8k tokens (articles to summarise together,
              this repository's source to edit), 128 tokens, n_ctx 12288; plain, auto,
              llama-completion, llama-lookup. Speedup and verify cost by context length.
    full      5 per category (every turn) + 10 HumanEvalFix, 128 tokens; the draft model when
              one is given, llama-cpp-python's lookup at 10 and 2 tokens. Hours.
    grounded  edit, extraction, summary and multi-turn agent work on Python stdlib sources
              (bench.grounded), 128 tokens; plain, auto, both oracles, llama-completion,
              llama-lookup. 14 prompts, 23 turns.
    grounded-quick  3 of those prompts (a planted bug, a JSON extraction, a 3-turn agent)
              for smoke runs; the same configurations.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

from ...api.labels import AUTO
from ...errors import InvalidInputError
from .matrix import BASELINE, ConfigSpec, Matrix, apply_overrides, parse_config
from .prompts import SPEC_BENCH_CATEGORIES

PRESETS = ("quick", "standard", "long", "full", "grounded", "grounded-quick")
LONG_TOKENS = (2048, 4096, 8192)


def _engine(*names: str) -> tuple[ConfigSpec, ...]:
    return tuple(parse_config(n) for n in names)


def _anchors(*names: str) -> tuple[ConfigSpec, ...]:
    return tuple(ConfigSpec.anchor(n) for n in names)


def preset(name: str) -> Matrix:
    base = dict(spec_bench=SPEC_BENCH_CATEGORIES, buckets=(256, 1024), temperature=0.0)
    if name == "quick":
        m = Matrix(preset="quick", per_category=1, max_turns=1, humanevalfix=2, max_new_tokens=64,
                   configs=_engine(BASELINE, "ngram", "suffix") + _anchors("llama-pld:10"), **base)
    elif name == "standard":
        m = Matrix(preset="standard", per_category=3, max_turns=1, humanevalfix=10,
                   max_new_tokens=128,
                   configs=_engine(BASELINE, AUTO, f"{AUTO}:exact=true")
                   + _anchors("llama-completion", "llama-lookup"), **base)
    elif name == "long":
        m = Matrix(preset="long", spec_bench=(), humanevalfix=0, long=LONG_TOKENS,
                   max_new_tokens=128, n_ctx=12288, buckets=(3072, 6144), temperature=0.0,
                   configs=_engine(BASELINE, AUTO) + _anchors("llama-completion", "llama-lookup"))
    elif name == "full":
        m = Matrix(preset="full", per_category=5, max_turns=None, humanevalfix=10,
                   max_new_tokens=128,
                   configs=_engine(BASELINE, "ngram", "suffix", "draft")
                   + _anchors("llama-pld:10", "llama-pld:2"), **base)
    elif name in ("grounded", "grounded-quick"):
        m = Matrix(preset=name, spec_bench=(), humanevalfix=0,
                   grounded="quick" if name == "grounded-quick" else "all",
                   max_new_tokens=128, n_ctx=4096, buckets=(1024, 2048), temperature=0.0,
                   configs=_engine(BASELINE, AUTO, "oracle", "oracle-copy")
                   + _anchors("llama-completion", "llama-lookup"))
    else:
        raise InvalidInputError(f"unknown preset '{name}'; choose {', '.join(PRESETS)}")
    return m.with_baseline()


def load_toml(path: str | Path, base: Matrix | None = None) -> Matrix:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"matrix file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidInputError(f"{path}: not valid TOML ({e})") from None
    return apply_overrides(base or preset(data.get("preset", "quick")), data, source=str(path))
