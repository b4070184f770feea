"""What a benchmark run measures: the matrix of configurations and the workload.

Built in layers: a preset (:mod:`edgespec.lab.bench.presets`), then a TOML file, then
command-line flags, each overriding the one before (:func:`compose`). The plain path
(proposer ``none``) is always part of the matrix: every speedup is paired against it,
except an anchor's, which is paired with the anchor's own plain path
(:mod:`edgespec.lab.bench.anchors`).

TOML example::

    target = "qwen-1.5b"
    draft = "qwen-0.5b"          # optional; needed by the "draft" proposer
    max_new_tokens = 64
    temperature = 0.0
    threads = 2
    n_gpu_layers = 0             # layers on the GPU (-1: all); the anchors get the same -ngl
    tree_width = 0               # scratch sequences for draft trees (engine --tree-width)
    buckets = [256, 1024]        # prompt-length bucket edges in tokens

    [prompts]
    spec_bench = ["summarization", "coding"]   # or "all"
    per_category = 2
    humanevalfix = 2
    long = [2048, 4096]          # grounded long prompts of about these many tokens
    jsonl = ["my_prompts.jsonl"]

    [[config]]
    proposer = "ngram"
    knobs = { k = 3 }

    [[anchor]]                   # see edgespec.lab.bench.anchors
    name = "llama-lookup"        # or "llama-pld:10", "llama-completion", ...
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Sequence

from ...api.labels import PLAIN
from ...errors import InvalidInputError, ensure
from . import anchors as anchor_specs
from .anchors import ANCHOR_KIND, ANCHORS
from .oracle import KINDS as ORACLES
from .prompts import HUMANEVALFIX, SPEC_BENCH_CATEGORIES

BASELINE = PLAIN


@dataclass(frozen=True)
class ConfigSpec:
    """One column of the matrix: an engine proposer with knobs, or an anchor."""

    proposer: str
    knobs: tuple[tuple[str, Any], ...] = ()
    kind: str = "engine"  # "engine" | "anchor"

    @property
    def label(self) -> str:
        if self.kind == ANCHOR_KIND:
            return anchor_specs.label(self.proposer, self.knobs[0][1] if self.knobs else None)
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
    def anchor(cls, text: str) -> "ConfigSpec":
        """``"llama-lookup"``, ``"llama-pld:10"``...: see edgespec.lab.bench.anchors."""
        name, n = anchor_specs.parse_anchor(text)
        knob = ANCHORS[name].knob
        return cls.make(name, {knob: n} if n is not None else None, kind=ANCHOR_KIND)

    @property
    def baseline(self) -> str:
        """The label this configuration's speedup is paired with."""
        if self.kind == ANCHOR_KIND:
            return anchor_specs.own_plain(self.label) or BASELINE
        return BASELINE

    @property
    def exact(self) -> bool:
        return self.kind != ANCHOR_KIND and bool(self.knob_dict.get("exact", False))

    @property
    def parity_baseline(self) -> str:
        """The label whose greedy text this one must reproduce: an exact configuration runs
        on an engine of its own (the batch-invariant kernel), so its plain path is that
        engine's (``none[exact=True]``), while its speed is still paired with ours."""
        if self.exact:
            # the exact plain path is a baseline itself: its text differs from ours by the
            # KV precision, which is no divergence of speculation
            return EXACT_BASELINE.label
        return self.baseline

    def to_dict(self) -> dict:
        return {"label": self.label, "proposer": self.proposer, "kind": self.kind,
                "knobs": self.knob_dict, "baseline": self.baseline,
                "parity_baseline": self.parity_baseline}


#: the plain path of the exact engine: what exact configurations' text is compared with
EXACT_BASELINE = ConfigSpec.make(BASELINE, {"exact": True})


def parse_config(text: str) -> ConfigSpec:
    """``"ngram"`` or ``"ngram:k=3,min_n=2"`` -> ConfigSpec (values become int/float/bool when they parse)."""
    name, _, rest = text.strip().partition(":")
    if not name:
        raise InvalidInputError(f"empty proposer in '{text}'; write NAME or NAME:KNOB=VALUE,...")
    if name in ANCHORS:
        return ConfigSpec.anchor(text)
    knobs = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise InvalidInputError(f"bad knob '{item}' in '{text}'; write NAME:KNOB=VALUE,...")
        knobs[k.strip()] = _scalar(v.strip())
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
    long: tuple[int, ...] = ()  # grounded long prompts of about these many tokens (prompts.py)
    grounded: str = ""  # "all" | "quick" | "edits": edit work on stdlib sources (bench.grounded)
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
    # where the engine runs: target and draft layers on the GPU (-1 or more than the model
    # has: all), and scratch KV sequences for draft trees (0: linear drafts only)
    n_gpu_layers: int = 0
    tree_width: int = 0
    anchor_n_ctx: int = 2048  # the anchor allocates n_ctx x n_vocab logits (models.md): keep modest
    # protocol
    warmup: int = 1  # requests per configuration run first and discarded
    #: rounds over the whole prompt set: each (prompt, turn) is measured this many times, a
    #: round at a time, so per-prompt figures rest on more than one sample of a noisy machine
    repeats: int = 1
    warmup_tokens: int = 8
    bootstrap_resamples: int = 2000
    # keep every engine request's passes for `edgespec bench --replay` (edgespec.lab.replay)
    record: bool = False
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
        ensure(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        ensure(self.temperature >= 0, f"temperature must be >= 0 (got {self.temperature})")
        ensure(self.per_category is None or self.per_category >= 1,
               f"per_category must be >= 1 (got {self.per_category})")
        ensure(self.humanevalfix >= 0, f"humanevalfix must be >= 0 (got {self.humanevalfix})")
        ensure(self.warmup >= 0, f"warmup must be >= 0 (got {self.warmup})")
        ensure(self.repeats >= 1, f"repeats must be >= 1 (got {self.repeats})")
        ensure(self.n_gpu_layers >= -1, f"n_gpu_layers must be >= -1 (got {self.n_gpu_layers})")
        ensure(0 <= self.tree_width <= 32,
               f"tree_width must be between 0 and 32 branches (got {self.tree_width})")
        ensure(0 < self.confidence < 1, f"confidence must be in (0, 1) (got {self.confidence})")
        ensure(all(b > 0 for b in self.buckets), "bucket edges must be positive token counts")
        unknown = [c for c in self.spec_bench if c not in SPEC_BENCH_CATEGORIES]
        ensure(not unknown, f"unknown Spec-Bench categories {', '.join(unknown)}; choose from "
                            f"{', '.join(SPEC_BENCH_CATEGORIES)}")
        ensure(bool(self.spec_bench or self.humanevalfix or self.long or self.jsonl
                    or self.grounded),
               "no prompts selected: pick Spec-Bench categories, --humanevalfix N or --jsonl FILE")
        ensure(all(n >= 256 for n in self.long), "long prompts must be at least 256 tokens")
        labels = self.labels
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        ensure(not dupes, f"configuration listed twice: {', '.join(dupes)}")
        ensure(labels and labels[0] == BASELINE, "the plain path must be the first configuration")
        ensure(self.draft is not None or all(c.proposer != "draft" for c in self.configs),
               "the 'draft' proposer needs a draft model: pass --draft NAME (e.g. qwen-0.5b)")
        ensure(self.draft is not None or all(
            not (c.kind == ANCHOR_KIND and ANCHORS[c.proposer].needs_draft) for c in self.configs),
            "the llama-speculative-simple anchor needs a draft model: pass --draft NAME")
        ensure(self.temperature == 0 or all(c.proposer not in ORACLES
                                            for c in self.configs),
               "an oracle configuration drafts the plain path's greedy answer: it needs "
               "temperature 0")
        missing = sorted({c.baseline for c in self.configs} - set(labels))
        ensure(not missing, f"an anchor's own plain path is missing: {', '.join(missing)} "
                            "(with_baseline() adds it)")
        return self

    def with_baseline(self) -> "Matrix":
        """The same matrix with the plain path first (added if absent) and every anchor's own
        plain path just before the first anchor that needs it."""
        out = [ConfigSpec(BASELINE)]
        if any(c.exact for c in self.configs):
            out.append(EXACT_BASELINE)
        for c in self.configs:
            if c.label == BASELINE or c in out:
                continue
            if c.baseline not in {x.label for x in out} and c.baseline != BASELINE:
                plain = ConfigSpec.anchor(c.baseline)
                out = [x for x in out if x != plain] + [plain]
            out.append(c)
        return replace(self, configs=tuple(out))

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["configs"] = [c.to_dict() for c in self.configs]
        d["spec_bench"] = list(self.spec_bench)
        d["jsonl"] = list(self.jsonl)
        d["long"] = list(self.long)
        d["buckets"] = list(self.buckets)
        return d


# --- TOML --------------------------------------------------------------------
_SCALARS = {"target", "draft", "max_new_tokens", "temperature", "seed", "threads", "n_ctx",
            "n_gpu_layers", "tree_width", "anchor_n_ctx", "warmup", "warmup_tokens",
            "repeats", "bootstrap_resamples", "confidence"}
_PROMPT_KEYS = {"spec_bench", "per_category", "max_turns", "humanevalfix", "long", "jsonl",
                "prompt_field", "jsonl_n", "grounded"}


def apply_overrides(m: Matrix, data: Mapping[str, Any], source: str = "matrix") -> Matrix:
    """Apply a TOML-shaped mapping onto a matrix; unknown keys are errors (typos must not pass)."""
    known = _SCALARS | {"preset", "buckets", "prompts", "config", "anchor"}
    unknown = sorted(set(data) - known)
    ensure(not unknown, f"{source}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    changes: dict[str, Any] = {k: data[k] for k in _SCALARS if k in data}
    if "buckets" in data:
        changes["buckets"] = tuple(int(b) for b in data["buckets"])
    prompts = data.get("prompts", {})
    bad = sorted(set(prompts) - _PROMPT_KEYS)
    ensure(not bad, f"{source}: unknown [prompts] keys {', '.join(bad)}; known: {', '.join(sorted(_PROMPT_KEYS))}")
    for k, v in prompts.items():
        if k == "spec_bench":
            changes[k] = spec_bench_selection(v)
        elif k == "jsonl":
            changes[k] = tuple([v] if isinstance(v, str) else v)
        elif k == "long":
            changes[k] = tuple(int(n) for n in v)
        else:
            changes[k] = v
    if "config" in data or "anchor" in data:
        configs = [ConfigSpec.make(c["proposer"], c.get("knobs")) for c in data.get("config", [])]
        configs += [_toml_anchor(a, source) for a in data.get("anchor", [])]
        changes["configs"] = tuple(configs)
    if "preset" in data:
        changes["preset"] = data["preset"]
    m = replace(m, **changes)
    return m


def _toml_anchor(a: Mapping[str, Any], source: str) -> ConfigSpec:
    if "name" in a:
        return ConfigSpec.anchor(str(a["name"]))
    if "num_pred_tokens" in a:  # the schema before named anchors: llama-cpp-python's lookup
        return ConfigSpec.anchor(f"llama-pld:{int(a['num_pred_tokens'])}")
    raise InvalidInputError(f"{source}: an [[anchor]] needs name = \"...\" ({anchor_specs.KNOWN})")


def spec_bench_selection(value: str | Sequence[str]) -> tuple[str, ...]:
    """"all" | "none" | "a,b" | ["a", "b"] -> categories (HumanEvalFix is selected separately)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [s.strip() for s in items if s.strip()]
    if items == ["all"]:
        return SPEC_BENCH_CATEGORIES
    if items in (["none"], []):
        return ()
    ensure(HUMANEVALFIX not in items, "HumanEvalFix is chosen with --humanevalfix N, not as a category")
    return tuple(items)
