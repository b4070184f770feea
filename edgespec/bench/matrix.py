"""What a benchmark run measures: the matrix of configurations and the workload.

Built in layers: a preset (``quick``/``full``), then a TOML file, then command-line
flags, each overriding the one before. The plain path (proposer ``none``) is
always part of the matrix: every speedup is paired against it.

TOML example::

    target = "qwen-1.5b"
    draft = "qwen-0.5b"          # optional; needed by the "draft" proposer
    max_new_tokens = 64
    temperature = 0.0
    threads = 2
    buckets = [256, 1024]        # prompt-length bucket edges in tokens

    [prompts]
    spec_bench = ["summarization", "coding"]   # or "all"
    per_category = 2
    humanevalfix = 2
    jsonl = ["my_prompts.jsonl"]

    [[config]]
    proposer = "ngram"
    knobs = { k = 3 }

    [[anchor]]                   # llama-cpp-python's LlamaPromptLookupDecoding
    num_pred_tokens = 10
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError
from .prompts import HUMANEVALFIX, SPEC_BENCH_CATEGORIES

BASELINE = "none"
ANCHOR_KIND = "anchor"
ANCHOR_NAME = "llama-cpp-pld"


@dataclass(frozen=True)
class ConfigSpec:
    """One column of the matrix: an engine proposer with knobs, or the llama-cpp-python anchor."""

    proposer: str
    knobs: tuple[tuple[str, Any], ...] = ()
    kind: str = "engine"  # "engine" | "anchor"

    @property
    def label(self) -> str:
        if not self.knobs:
            return self.proposer
        return f"{self.proposer}[{','.join(f'{k}={v}' for k, v in self.knobs)}]"

    @property
    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    @classmethod
    def make(cls, proposer: str, knobs: Mapping[str, Any] | None = None,
             kind: str = "engine") -> "ConfigSpec":
        return cls(proposer=proposer, knobs=tuple(sorted((knobs or {}).items())), kind=kind)

    @classmethod
    def anchor(cls, num_pred_tokens: int) -> "ConfigSpec":
        if num_pred_tokens < 1:
            raise InvalidInputError(f"anchor num_pred_tokens must be >= 1 (got {num_pred_tokens})")
        return cls.make(ANCHOR_NAME, {"num_pred_tokens": num_pred_tokens}, kind=ANCHOR_KIND)

    def to_dict(self) -> dict:
        return {"label": self.label, "proposer": self.proposer, "kind": self.kind,
                "knobs": self.knob_dict}


def parse_config(text: str) -> ConfigSpec:
    """``"ngram"`` or ``"ngram:k=3,min_n=2"`` -> ConfigSpec (values become int/float/bool when they parse)."""
    name, _, rest = text.strip().partition(":")
    if not name:
        raise InvalidInputError(f"empty proposer in '{text}'; write NAME or NAME:KNOB=VALUE,...")
    knobs = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise InvalidInputError(f"bad knob '{item}' in '{text}'; write NAME:KNOB=VALUE,...")
        knobs[k.strip()] = _scalar(v.strip())
    if name == ANCHOR_NAME:
        return ConfigSpec.anchor(int(knobs.get("num_pred_tokens", 10)))
    return ConfigSpec.make(name, knobs)


def _scalar(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


@dataclass(frozen=True)
class Matrix:
    target: str = "qwen-1.5b"
    draft: str | None = None
    configs: tuple[ConfigSpec, ...] = (ConfigSpec(BASELINE),)
    # workload
    spec_bench: tuple[str, ...] = SPEC_BENCH_CATEGORIES  # () = none
    per_category: int | None = 1  # None = every question of the category
    max_turns: int | None = None  # None = every turn
    humanevalfix: int = 0
    jsonl: tuple[str, ...] = ()
    prompt_field: str = "prompt"
    jsonl_n: int | None = None
    buckets: tuple[int, ...] = (256, 1024)
    # generation
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    threads: int | None = None
    n_ctx: int = 4096
    anchor_n_ctx: int = 2048  # the anchor allocates n_ctx x n_vocab logits (models.md): keep modest
    # protocol
    warmup: int = 1  # requests per configuration run first and discarded
    warmup_tokens: int = 8
    bootstrap_resamples: int = 2000
    confidence: float = 0.95
    preset: str = "custom"

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.configs]

    @property
    def engine_configs(self) -> list[ConfigSpec]:
        return [c for c in self.configs if c.kind == "engine"]

    @property
    def anchor_configs(self) -> list[ConfigSpec]:
        return [c for c in self.configs if c.kind == ANCHOR_KIND]

    def validate(self) -> "Matrix":
        _guard(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        _guard(self.temperature >= 0, f"temperature must be >= 0 (got {self.temperature})")
        _guard(self.per_category is None or self.per_category >= 1,
               f"per_category must be >= 1 (got {self.per_category})")
        _guard(self.humanevalfix >= 0, f"humanevalfix must be >= 0 (got {self.humanevalfix})")
        _guard(self.warmup >= 0, f"warmup must be >= 0 (got {self.warmup})")
        _guard(0 < self.confidence < 1, f"confidence must be in (0, 1) (got {self.confidence})")
        _guard(all(b > 0 for b in self.buckets), "bucket edges must be positive token counts")
        unknown = [c for c in self.spec_bench if c not in SPEC_BENCH_CATEGORIES]
        _guard(not unknown, f"unknown Spec-Bench categories {', '.join(unknown)}; choose from "
                            f"{', '.join(SPEC_BENCH_CATEGORIES)}")
        _guard(bool(self.spec_bench or self.humanevalfix or self.jsonl),
               "no prompts selected: pick Spec-Bench categories, --humanevalfix N or --jsonl FILE")
        labels = self.labels
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        _guard(not dupes, f"configuration listed twice: {', '.join(dupes)}")
        _guard(labels and labels[0] == BASELINE, "the plain path must be the first configuration")
        _guard(self.draft is not None or all(c.proposer != "draft" for c in self.configs),
               "the 'draft' proposer needs a draft model: pass --draft NAME (e.g. qwen-0.5b)")
        return self

    def with_baseline(self) -> "Matrix":
        """The same matrix with the plain path first (added if absent)."""
        rest = tuple(c for c in self.configs if c.label != BASELINE)
        return replace(self, configs=(ConfigSpec(BASELINE),) + rest)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["configs"] = [c.to_dict() for c in self.configs]
        d["spec_bench"] = list(self.spec_bench)
        d["jsonl"] = list(self.jsonl)
        d["buckets"] = list(self.buckets)
        return d


def _guard(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInputError(message)


# --- presets -----------------------------------------------------------------
def preset(name: str) -> Matrix:
    """``quick``: one prompt per Spec-Bench category (first turn) + 2 HumanEvalFix, 64 tokens,
    plain / ngram / suffix / llama-cpp-python prompt lookup; under ~10 minutes on 2 cores with
    Qwen 1.5B. ``full``: 5 per category (all turns) + 10 HumanEvalFix, 128 tokens, and the draft
    model when one is given."""
    base = dict(spec_bench=SPEC_BENCH_CATEGORIES, buckets=(256, 1024), temperature=0.0)
    if name == "quick":
        return Matrix(preset="quick", per_category=1, max_turns=1, humanevalfix=2,
                      max_new_tokens=64,
                      configs=(ConfigSpec(BASELINE), ConfigSpec("ngram"), ConfigSpec("suffix"),
                               ConfigSpec.anchor(10)), **base)
    if name == "full":
        return Matrix(preset="full", per_category=5, max_turns=None, humanevalfix=10,
                      max_new_tokens=128,
                      configs=(ConfigSpec(BASELINE), ConfigSpec("ngram"), ConfigSpec("suffix"),
                               ConfigSpec("draft"), ConfigSpec.anchor(10), ConfigSpec.anchor(2)),
                      **base)
    raise InvalidInputError(f"unknown preset '{name}'; choose quick or full")


PRESETS = ("quick", "full")


# --- TOML --------------------------------------------------------------------
_SCALARS = {"target", "draft", "max_new_tokens", "temperature", "seed", "threads", "n_ctx",
            "anchor_n_ctx", "warmup", "warmup_tokens", "bootstrap_resamples", "confidence"}
_PROMPT_KEYS = {"spec_bench", "per_category", "max_turns", "humanevalfix", "jsonl", "prompt_field",
                "jsonl_n"}


def load_toml(path: str | Path, base: Matrix | None = None) -> Matrix:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"matrix file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidInputError(f"{path}: not valid TOML ({e})") from None
    return apply_overrides(base or preset(data.get("preset", "quick")), data, source=str(path))


def apply_overrides(m: Matrix, data: Mapping[str, Any], source: str = "matrix") -> Matrix:
    """Apply a TOML-shaped mapping onto a matrix; unknown keys are errors (typos must not pass)."""
    known = _SCALARS | {"preset", "buckets", "prompts", "config", "anchor"}
    unknown = sorted(set(data) - known)
    _guard(not unknown, f"{source}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    changes: dict[str, Any] = {k: data[k] for k in _SCALARS if k in data}
    if "buckets" in data:
        changes["buckets"] = tuple(int(b) for b in data["buckets"])
    prompts = data.get("prompts", {})
    bad = sorted(set(prompts) - _PROMPT_KEYS)
    _guard(not bad, f"{source}: unknown [prompts] keys {', '.join(bad)}; known: {', '.join(sorted(_PROMPT_KEYS))}")
    for k, v in prompts.items():
        if k == "spec_bench":
            changes[k] = spec_bench_selection(v)
        elif k == "jsonl":
            changes[k] = tuple([v] if isinstance(v, str) else v)
        else:
            changes[k] = v
    if "config" in data or "anchor" in data:
        configs = [ConfigSpec.make(c["proposer"], c.get("knobs")) for c in data.get("config", [])]
        configs += [ConfigSpec.anchor(int(a.get("num_pred_tokens", 10))) for a in data.get("anchor", [])]
        changes["configs"] = tuple(configs)
    if "preset" in data:
        changes["preset"] = data["preset"]
    m = replace(m, **changes)
    return m


def spec_bench_selection(value: str | Sequence[str]) -> tuple[str, ...]:
    """"all" | "none" | "a,b" | ["a", "b"] -> categories (HumanEvalFix is selected separately)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [s.strip() for s in items if s.strip()]
    if items == ["all"]:
        return SPEC_BENCH_CATEGORIES
    if items in (["none"], []):
        return ()
    _guard(HUMANEVALFIX not in items, "HumanEvalFix is chosen with --humanevalfix N, not as a category")
    return tuple(items)
