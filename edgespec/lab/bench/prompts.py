"""Benchmark prompt sets: Spec-Bench, HumanEvalFix, or any JSONL with a prompt field.

A :class:`BenchPrompt` is one conversation: its user turns are sent one after
another, each with the model's own earlier answers in the history (Spec-Bench's
MT-bench categories have two turns). The engine applies the target's GGUF chat
template to the messages list, so prompts stay plain text here.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

from ...errors import InvalidInputError

SPEC_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
    "translation", "summarization", "qa", "math_reasoning", "rag",
)
HUMANEVALFIX = "humanevalfix"
SPEC_BENCH_FILE = "spec_bench_question.jsonl"
HUMANEVALFIX_FILE = "humanevalfix_python.jsonl"


@dataclass(frozen=True)
class BenchPrompt:
    id: str  # unique within a run: "<source>/<upstream id>"
    category: str
    turns: tuple[str, ...]
    source: str  # "spec_bench" | "humanevalfix" | the JSONL file name

    def messages(self, answers: Sequence[str]) -> list[dict]:
        """The messages for the next turn, given the model's answers to the earlier ones."""
        if len(answers) >= len(self.turns):
            raise ValueError(f"{self.id}: all {len(self.turns)} turns already answered")
        out: list[dict] = []
        for turn, answer in zip(self.turns, answers):
            out.append({"role": "user", "content": turn})
            out.append({"role": "assistant", "content": answer})
        out.append({"role": "user", "content": self.turns[len(answers)]})
        return out


def default_data_dir() -> Path:
    """Where the shipped prompt sets live: $EDGESPEC_BENCH_DATA, else the package data in
    edgespec/lab/bench/data/ (verbatim copies with their sources and licenses in its SOURCES.md),
    so the presets run from a pip install as from a checkout. edgespec is installed as files
    (its native extension cannot load from a zip), so the resource is a real folder."""
    env = os.environ.get("EDGESPEC_BENCH_DATA")
    if env:
        return Path(env)
    return Path(str(resources.files(__package__).joinpath("data")))


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise InvalidInputError(
            f"prompt file {path} not found; set EDGESPEC_BENCH_DATA to the folder holding "
            f"{SPEC_BENCH_FILE} and {HUMANEVALFIX_FILE}, or pass an existing JSONL file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows


def _take(rows: Iterable[dict], per_category: int | None, key) -> list[dict]:
    """The first ``per_category`` rows of each category, in file order (deterministic, so runs compare)."""
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        c = key(row)
        if per_category is not None and seen.get(c, 0) >= per_category:
            continue
        seen[c] = seen.get(c, 0) + 1
        out.append(row)
    return out


def load_spec_bench(path: Path | None = None, categories: Sequence[str] | None = None,
                    per_category: int | None = None, max_turns: int | None = None) -> list[BenchPrompt]:
    """Spec-Bench questions, the first ``per_category`` of each requested category."""
    wanted = tuple(categories) if categories else SPEC_BENCH_CATEGORIES
    unknown = [c for c in wanted if c not in SPEC_BENCH_CATEGORIES]
    if unknown:
        raise InvalidInputError(
            f"unknown Spec-Bench categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
            f"choose from {', '.join(SPEC_BENCH_CATEGORIES)}")
    rows = _read_jsonl(path or default_data_dir() / SPEC_BENCH_FILE)
    rows = [r for r in rows if r.get("category") in wanted]
    rows = _take(rows, per_category, lambda r: r["category"])
    # Keep the requested category order so reports list categories the same way every run.
    rows.sort(key=lambda r: wanted.index(r["category"]))
    return [BenchPrompt(id=f"spec_bench/{r['question_id']}", category=r["category"],
                        turns=tuple(r["turns"][:max_turns] if max_turns else r["turns"]),
                        source="spec_bench")
            for r in rows]


def humanevalfix_prompt(row: dict) -> str:
    """OctoPack's HumanEvalFix prompt: the buggy function with its tests, then the instruction."""
    code = row["declaration"] + row["buggy_solution"] + row["test"]
    return f"{code}\nFix bugs in {row['entry_point']}."


def load_humanevalfix(path: Path | None = None, n: int | None = None) -> list[BenchPrompt]:
    rows = _read_jsonl(path or default_data_dir() / HUMANEVALFIX_FILE)
    missing = [k for k in ("task_id", "declaration", "buggy_solution", "test", "entry_point")
               if rows and k not in rows[0]]
    if missing:
        raise InvalidInputError(f"HumanEvalFix file lacks the fields {', '.join(missing)}")
    rows = rows[:n] if n is not None else rows
    return [BenchPrompt(id=f"humanevalfix/{r['task_id']}", category=HUMANEVALFIX,
                        turns=(humanevalfix_prompt(r),), source="humanevalfix")
            for r in rows]


def load_jsonl_prompts(path: Path, field: str = "prompt", category_field: str = "category",
                       n: int | None = None) -> list[BenchPrompt]:
    """Any JSONL file: ``field`` holds a string (one turn) or a list of strings (turns)."""
    path = Path(path)
    rows = _read_jsonl(path)
    out = []
    for i, r in enumerate(rows[:n] if n is not None else rows):
        value = r.get(field)
        turns = (value,) if isinstance(value, str) else tuple(value or ())
        if not turns or not all(isinstance(t, str) and t for t in turns):
            raise InvalidInputError(
                f"{path}: record {i + 1} has no non-empty string (or list of strings) in field "
                f"'{field}'; choose the field with --prompt-field")
        rid = r.get("id", r.get("question_id", r.get("task_id", i)))
        out.append(BenchPrompt(id=f"{path.stem}/{rid}", category=str(r.get(category_field, path.stem)),
                               turns=turns, source=path.name))
    return out


# --- long, grounded prompts ---------------------------------------------------------
# Characters per token, to size a prompt before any tokenizer is loaded; the report buckets
# by the tokens the plain path actually saw, so an estimate only needs to land near its target.
NEWS_CHARS_PER_TOKEN = 4.2
CODE_CHARS_PER_TOKEN = 3.4
LONG_SUMMARY = "long-summarization"
LONG_CODE = "long-code-edit"


def long_summary_prompt(articles: Sequence[str], target_tokens: int) -> str:
    """Articles (in order) until about ``target_tokens``, to be summarised together."""
    budget = int(target_tokens * NEWS_CHARS_PER_TOKEN)
    parts, size = [], 0
    for a in articles:
        if size >= budget:
            break
        parts.append(f"Article {len(parts) + 1}:\n{a.strip()}")
        size += len(parts[-1])
    return ("Here are several news articles.\n\n" + "\n\n".join(parts) + "\n\nSummarize "
            "each article in two sentences, then write one paragraph on what they have in common.")


def long_code_prompt(files: Sequence[tuple[str, str]], target_tokens: int) -> str:
    """Source files (path, text) until about ``target_tokens`` (the last one cut at a line),
    with an edit that makes the model copy most of them back."""
    budget = int(target_tokens * CODE_CHARS_PER_TOKEN)
    parts, size = [], 0
    for path, text in files:
        if size >= budget:
            break
        room = budget - size
        if len(text) > room:
            text = text[:room].rsplit("\n", 1)[0] + "\n"
        parts.append(f"# file: {path}\n{text}")
        size += len(parts[-1])
    return ("\n".join(parts) + "\nRename every local variable called `out` in the code above "
            "to `result`, and return the complete updated code of every file, unchanged otherwise.")


def _package_sources() -> list[tuple[str, str]]:
    """This package's own Python files, largest first (the package is always installed, so
    the prompts exist wherever edgespec runs)."""
    root = Path(__file__).resolve().parents[2]  # edgespec/ (this file: edgespec/lab/bench/)
    files = [(p.relative_to(root.parent).as_posix(), p.read_text(encoding="utf-8"))
             for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts]
    return sorted(files, key=lambda f: (-len(f[1]), f[0]))


def load_long(targets: Sequence[int], path: Path | None = None) -> list[BenchPrompt]:
    """Per target length: Spec-Bench summarization articles to summarise together, and this
    repository's source to edit."""
    rows = _read_jsonl(path or default_data_dir() / SPEC_BENCH_FILE)
    articles = [r["turns"][0].split(":", 1)[-1] for r in rows if r.get("category") == "summarization"]
    if not articles:
        raise InvalidInputError(f"no summarization questions in {path or SPEC_BENCH_FILE}")
    sources = _package_sources()
    out = []
    for n in targets:
        out.append(BenchPrompt(f"long/summary-{n}", LONG_SUMMARY,
                               (long_summary_prompt(articles, n),), "long"))
        out.append(BenchPrompt(f"long/code-{n}", LONG_CODE, (long_code_prompt(sources, n),), "long"))
    return out


# --- prompt-length buckets ---------------------------------------------------
def bucket_label(n_tokens: int, edges: Sequence[int]) -> str:
    """The bucket of a prompt length: edges [256, 1024] give "<256", "256-1024", ">=1024"."""
    edges = sorted(edges)
    if not edges:
        return "all"
    if n_tokens < edges[0]:
        return f"<{edges[0]}"
    for lo, hi in zip(edges, edges[1:]):
        if lo <= n_tokens < hi:
            return f"{lo}-{hi}"
    return f">={edges[-1]}"


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """Every label bucket_label can return for these edges, shortest first."""
    edges = sorted(edges)
    if not edges:
        return ["all"]
    return [f"<{edges[0]}"] + [f"{lo}-{hi}" for lo, hi in zip(edges, edges[1:])] + [f">={edges[-1]}"]
