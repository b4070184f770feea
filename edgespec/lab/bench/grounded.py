"""The grounded slice of the bench (`--preset grounded`, `grounded-quick`): real edit work on
text nobody here wrote, the Python standard library of the running interpreter.

Every task reads one stdlib object by a FIXED list (:data:`SOURCES`): a function's or a
module's source (``inspect.getsource``) or a long document (a docstring, ``heapq.__about__``),
pinned by the sha256 of that text. A source this Python lacks, or whose text differs from
every pinned digest, is skipped *by name* (the console and the report say which and why),
so the set never changes silently; the ones used are recorded with their digest, file and
the Python version (:class:`GroundedSet`, kept in ``bench.json`` as ``identity.grounded``).

The tasks (a prompt's category):

* ``grounded-type-hints``, ``grounded-rename``, ``grounded-docstrings``,
  ``grounded-comprehension``: an edit instruction, the answer is the whole code back, edited;
* ``grounded-fix-bug``: one deterministic textual change planted in the source (recorded:
  the line, the text before and after), to be found and fixed;
* ``grounded-extract``: verbatim and JSON extraction from a module's source or docs;
* ``grounded-summary``: summarization of a long real document;
* ``grounded-agent``: one function rewritten over 3-5 turns, each turn asking for the
  complete new version, with the model's previous versions in the conversation (the runner
  carries each configuration's own answers: an editor agent's suffix state).

Sizes: every prompt, with 128 new tokens per turn, fits Qwen 1.5B's default 4096-token
context (checked by the unit tests with a conservative characters-per-token estimate).
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ...errors import InvalidInputError
from .prompts import BenchPrompt
from .results import OVERALL, PLAIN_LLAMA, speedup_table, vs_llama_table

SOURCE = "grounded"  # BenchPrompt.source of every grounded prompt
# Matrix.grounded: the whole slice, the 3-prompt smoke set, or the code edits alone
SETS = ("all", "quick", "edits")
# The tasks whose answer is the whole code back, edited; the report's row of their geomean.
EDIT_CATEGORIES = ("grounded-type-hints", "grounded-rename", "grounded-docstrings",
                   "grounded-comprehension", "grounded-fix-bug")
EDITS_ROW = "code edits"
# A turn's answer is at most this many tokens in the presets; the size check adds it per turn.
ANSWER_TOKENS = 128
CONTEXT_TOKENS = 4096  # Qwen 1.5B's default context in the bench
# Below every prompt's own ratio under Qwen 2.5's tokenizer (measured: 2.38 characters per
# token for colorsys, whose float constants tokenize digit by digit; 3.6-5.1 for the others;
# the most any prompt needs with its answers is about 2,200 tokens), so the estimate
# over-counts the tokens a prompt takes.
CHARS_PER_TOKEN = 2.25


@dataclass(frozen=True)
class Source:
    """One stdlib text: ``name`` is an importable dotted path (module, then attributes);
    ``kind`` "source" is inspect.getsource of it, "doc" its docstring (a str attribute as it
    is). ``sha256`` holds the digests of the texts this slice was written against."""

    name: str
    kind: str
    sha256: tuple[str, ...]


#: The fixed list. A new Python whose text of one of these differs gets it skipped by name;
#: add its digest here once the tasks below still make sense on the new text.
SOURCES: tuple[Source, ...] = (
    Source("textwrap.dedent", "source",
           ("cbb66d5cdd5ca9ebc2e9879f70910dd5577d33cd78bf8220320202a6c2abf1b8",)),
    Source("fnmatch.filter", "source",
           ("98d2c800fcbb8ee15469edb2d99e04601c6ce19f308c6fae0da87d7d8813f2ed",)),
    Source("statistics.median", "source",
           ("a080def79e00b8e0ebfc97c939f0de4da98ffc4e0f2175b3368d5f4a7e4626d5",)),
    Source("heapq._siftup", "source",
           ("136c35d6c8dfb2c475d08e84b8b5b0723024402a69b319875702c445eaab27b7",)),
    Source("csv.Sniffer.has_header", "source",
           ("15c79e448bf28bd8323fb35d116843450c89bbea5ab052f0a80c025a12121be2",)),
    Source("textwrap.TextWrapper._wrap_chunks", "source",
           ("ebb6d86cf855b58e358ab2085aac208e024bd37d66bfeacf77cb5e28bab2e1a7",)),
    Source("urllib.parse.parse_qsl", "source",
           ("ed312d563bb0c7546ba92588c39568a5ae39fe024ab1b55f0e1fd7f4ae21959c",)),
    Source("textwrap.indent", "source",
           ("beb165e1d43e788b252e3abf2ec85df768160924028a44205699115c08300621",)),
    Source("colorsys", "source",
           ("d9800f8e81d46e63ca6f2e7d6ac5f344d85afb92c3cf6d103b5f977f1ad66ac2",)),
    Source("bisect", "source",
           ("e5b2ff166f48a06e70ae831d8c9b47283fcd0c254306eee12d3dae9c55e11526",)),
    Source("glob", "source",
           ("fa579f8a50a66313d34d339f10be0821c9b4fed6207e8ba8e29ed1c5e119f740",)),
    Source("heapq.__about__", "doc",
           ("ab8a707f953445e27e50412216381eb9444b0f5e5396f154a5223e3962b2986c",)),
    Source("difflib.SequenceMatcher", "doc",
           ("93d957d99956a5924c7922ca712be8ab679f0f1d80bcfbe5749395819005c61a",)),
)

_RETURN_ALL = "Return the complete updated code in one Python code block, unchanged otherwise."


@dataclass(frozen=True)
class Task:
    """One prompt of the slice: ``turns[0]`` is followed by the source text; later turns
    refer to the model's previous answer. ``plant`` = (old, new): the planted bug, ``old``
    occurring exactly once in the source."""

    id: str
    category: str
    source: str
    turns: tuple[str, ...]
    plant: tuple[str, str] | None = None
    quick: bool = False


TASKS: tuple[Task, ...] = (
    Task("type-hints/urllib.parse.parse_qsl", "grounded-type-hints", "urllib.parse.parse_qsl",
         (f"Add type hints to every parameter and to the return value of this function. "
          f"{_RETURN_ALL}",)),
    Task("rename/textwrap.TextWrapper._wrap_chunks", "grounded-rename",
         "textwrap.TextWrapper._wrap_chunks",
         (f"Rename the local variable `cur_line` to `current_line` everywhere in this method, "
          f"comments included. {_RETURN_ALL}",)),
    Task("docstrings/csv.Sniffer.has_header", "grounded-docstrings", "csv.Sniffer.has_header",
         ("Turn the comment block at the top of this method into a proper docstring (keep its "
          f"wording) and add a one-line comment above each loop. {_RETURN_ALL}",)),
    Task("comprehension/fnmatch.filter", "grounded-comprehension", "fnmatch.filter",
         (f"Rewrite both `for` loops of this function as list comprehensions. {_RETURN_ALL}",)),
    Task("fix-bug/statistics.median", "grounded-fix-bug", "statistics.median",
         (f"This function has exactly one bug. Find it and fix it. {_RETURN_ALL}",),
         plant=("(data[i - 1] + data[i]) / 2", "(data[i - 2] + data[i]) / 2"), quick=True),
    Task("fix-bug/heapq._siftup", "grounded-fix-bug", "heapq._siftup",
         (f"This function has exactly one bug. Find it and fix it. {_RETURN_ALL}",),
         plant=("rightpos = childpos + 1", "rightpos = childpos + 2")),
    Task("extract/colorsys", "grounded-extract", "colorsys",
         ("Copy out, exactly as written, the `def` line and the body of every function in this "
          "module that converts *from* RGB, and nothing else.",)),
    Task("extract-json/bisect", "grounded-extract", "bisect",
         ("Extract every function defined in this module as a JSON array of objects with the "
          "keys \"name\", \"parameters\" (the parameter list exactly as written in its def "
          "line) and \"first_line\" (the first line of its docstring, verbatim). Output only "
          "the JSON.",), quick=True),
    Task("summary/heapq.__about__", "grounded-summary", "heapq.__about__",
         ("Summarize this essay on heaps in one paragraph, then list its three main points as "
          "bullets.",)),
    Task("summary/glob", "grounded-summary", "glob",
         ("Summarize what this module does: one paragraph on its public functions, then one "
          "bullet per private helper naming it and saying what it is for.",)),
    Task("summary/difflib.SequenceMatcher", "grounded-summary", "difflib.SequenceMatcher",
         ("Summarize this class documentation in five bullets, quoting each method it names "
          "exactly as written.",)),
    Task("agent/textwrap.dedent", "grounded-agent", "textwrap.dedent",
         (f"Add type hints to this function. {_RETURN_ALL}",
          f"In your version, rename the variable `margin` to `common_prefix` everywhere. "
          f"{_RETURN_ALL}",
          f"Now delete the `if 0 and margin:` sanity-check block from your version. {_RETURN_ALL}",
          f"Now shorten the docstring of your version to its first line. {_RETURN_ALL}")),
    Task("agent/fnmatch.filter", "grounded-agent", "fnmatch.filter",
         (f"Add type hints to this function. {_RETURN_ALL}",
          f"In your version, rename `result` to `matches` everywhere. {_RETURN_ALL}",
          f"Now add a comment above the `else:` branch saying why it exists. {_RETURN_ALL}"),
         quick=True),
    Task("agent/textwrap.indent", "grounded-agent", "textwrap.indent",
         (f"Add type hints to this function and to its nested functions. {_RETURN_ALL}",
          f"In your version, rename `prefixed_lines` to `_prefixed` everywhere. {_RETURN_ALL}",
          f"Now rewrite the generator as a generator expression passed to ''.join. "
          f"{_RETURN_ALL}",
          f"Now add a doctest example to the docstring of your version. {_RETURN_ALL}",
          f"Now rename the parameter `predicate` to `keep` everywhere in your version. "
          f"{_RETURN_ALL}")),
)


# --- reading the sources --------------------------------------------------------------------
@dataclass(frozen=True)
class Used:
    """A source as this Python has it: its digest, file and length, for the report."""

    name: str
    kind: str
    sha256: str
    file: str
    chars: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "sha256": self.sha256, "file": self.file,
                "chars": self.chars}


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str  # "missing: ..." or "changed: ..."
    tasks: tuple[str, ...]  # the task ids left out with it

    def line(self) -> str:
        return (f"grounded: skipped {self.name} ({self.reason}); left out: "
                f"{', '.join(self.tasks) or 'no task'}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "tasks": list(self.tasks)}


@dataclass(frozen=True)
class Planted:
    task: str
    line: int  # 1-based, in the source text
    before: str
    after: str

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "line": self.line, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class GroundedSet:
    """The prompts of one grounded set and what they were built from."""

    which: str
    python: str
    prompts: tuple[BenchPrompt, ...]
    used: tuple[Used, ...]
    skipped: tuple[Skipped, ...]
    planted: tuple[Planted, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"set": self.which, "python": self.python,
                "used": [u.to_dict() for u in self.used],
                "skipped": [s.to_dict() for s in self.skipped],
                "planted": [p.to_dict() for p in self.planted]}


def _resolve(name: str) -> Any:
    """The object at a dotted stdlib path: the longest importable module, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module for {name}")


def read_source(src: Source) -> tuple[str, str]:
    """(text, file) of a source on this Python; raises LookupError with the reason when it
    is missing (no module or attribute, no source file: a C-only build, a stripped install)."""
    try:
        obj = _resolve(src.name)
        if src.kind == "doc":
            text = obj if isinstance(obj, str) else inspect.getdoc(obj)
            if not text:
                raise LookupError(f"missing: {src.name} has no documentation on this Python")
        else:
            text = inspect.getsource(obj)
        mod = inspect.getmodule(obj) or sys.modules.get(src.name.split(".")[0])
        file = inspect.getsourcefile(mod) if mod is not None else None
    except LookupError:
        raise
    except (ImportError, AttributeError, OSError, TypeError) as e:
        raise LookupError(f"missing: {type(e).__name__}: {e}") from None
    return text, _short_path(file)


def _short_path(file: str | None) -> str:
    """The file relative to the stdlib folder (the same on every install of a version)."""
    if not file:
        return "?"
    p = Path(file)
    for parent in p.parents:
        if parent.name.startswith("python3"):
            return p.relative_to(parent).as_posix()
    return p.name


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plant_bug(text: str, old: str, new: str) -> tuple[str, int]:
    """The text with its one occurrence of ``old`` replaced by ``new``, and the 1-based line
    of the change. Deterministic; a text where ``old`` is not exactly once is refused."""
    n = text.count(old)
    if n != 1:
        raise InvalidInputError(f"cannot plant the bug: {old!r} occurs {n} times, not once")
    at = text.index(old)
    return text.replace(old, new, 1), text.count("\n", 0, at) + 1


def _first_turn(instruction: str, src: Source, text: str) -> str:
    if src.kind == "doc":
        return f"{instruction}\n\nThe documentation of `{src.name}`:\n\n{text.strip()}\n"
    return f"{instruction}\n\n```python\n{text.rstrip()}\n```\n"


def build(which: str = "all", sources: Sequence[Source] = SOURCES,
          tasks: Sequence[Task] = TASKS,
          reader: Callable[[Source], tuple[str, str]] = read_source) -> GroundedSet:
    """The prompts of set ``which`` (one of :data:`SETS`) from this Python's stdlib, in the
    fixed order of ``tasks``; sources missing or changed are skipped by name."""
    if which not in SETS:
        raise InvalidInputError(f"unknown grounded set '{which}'; choose {', '.join(SETS)}")
    chosen = [t for t in tasks if which == "all" or (t.quick if which == "quick"
                                                      else t.category in EDIT_CATEGORIES)]
    by_name = {s.name: s for s in sources}
    unknown = sorted({t.source for t in chosen} - set(by_name))
    if unknown:
        raise InvalidInputError(f"grounded tasks name sources not in the list: {', '.join(unknown)}")
    texts: dict[str, str] = {}
    used: list[Used] = []
    skipped: list[Skipped] = []
    for name in dict.fromkeys(t.source for t in chosen):  # first use order, each once
        src = by_name[name]
        left_out = tuple(t.id for t in chosen if t.source == name)
        try:
            text, file = reader(src)
        except LookupError as e:
            skipped.append(Skipped(name, str(e), left_out))
            continue
        d = digest(text)
        if d not in src.sha256:
            skipped.append(Skipped(name, f"changed: sha256 {d[:16]}… is not the pinned "
                                         f"{', '.join(x[:16] + '…' for x in src.sha256)}",
                                   left_out))
            continue
        texts[name] = text
        used.append(Used(name, src.kind, d, file, len(text)))
    prompts: list[BenchPrompt] = []
    planted: list[Planted] = []
    for t in chosen:
        if t.source not in texts:
            continue
        text = texts[t.source]
        if t.plant is not None:
            before_line = text.splitlines()
            text, line = plant_bug(text, *t.plant)
            planted.append(Planted(t.id, line, before_line[line - 1],
                                   text.splitlines()[line - 1]))
        first = _first_turn(t.turns[0], by_name[t.source], text)
        prompts.append(BenchPrompt(f"{SOURCE}/{t.id}", t.category, (first, *t.turns[1:]),
                                   SOURCE))
    return GroundedSet(which, sys.version.split()[0], tuple(prompts), tuple(used),
                       tuple(skipped), tuple(planted))


def estimated_tokens(p: BenchPrompt, answer_tokens: int = ANSWER_TOKENS) -> int:
    """A generous upper estimate of the context the last turn of ``p`` needs: every turn's
    text, every answer at ``answer_tokens``, and a template overhead per message."""
    text = sum(len(t) for t in p.turns)
    return math.ceil(text / CHARS_PER_TOKEN) + len(p.turns) * (answer_tokens + 16)


# --- the report's section -------------------------------------------------------------------
def _x(cell: Any) -> str:
    iv = cell.decode
    return "–" if not iv.n or math.isnan(iv.estimate) else f"{iv.estimate:.2f}×"


def report_section(run: Mapping[str, Any]) -> list[str]:
    """Markdown lines for a run with grounded prompts: what they were built from, then the
    decode speedup per task and, for the agent slice, per turn, each over our plain path and
    over llama-completion when the run has it. [] for a run without grounded prompts."""
    info = run.get("identity", {}).get("grounded")
    recs = [r for r in run["records"] if r.get("source") == SOURCE]
    if not info and not recs:
        return []
    lines = ["## Grounded slice (Python standard library)", ""]
    if info:
        lines += [f"Texts of Python {info['python']}'s standard library, set `{info['set']}`, "
                  "pinned by sha256 (edgespec/lab/bench/grounded.py):", "",
                  "| source | kind | file | chars | sha256 |", "|---|---|---|---|---|"]
        lines += [f"| `{u['name']}` | {u['kind']} | {u['file']} | {u['chars']} | "
                  f"{u['sha256'][:16]}… |" for u in info["used"]]
        lines.append("")
        for s in info["skipped"]:
            lines.append(f"**Skipped** `{s['name']}` ({s['reason']}); left out: "
                         f"{', '.join(s['tasks']) or 'no task'}.")
        for p in info["planted"]:
            lines.append(f"Planted bug in `{p['task']}`, line {p['line']}: `{p['before'].strip()}`"
                         f" → `{p['after'].strip()}`.")
        lines.append("")
    if not recs:
        return lines
    sub = {**run, "records": recs}
    tasks = list(dict.fromkeys(r["category"] for r in recs))
    rows = [*tasks, EDITS_ROW]
    lines += _grid("Per task, decode speedup over our plain path (median per task, geometric "
                   "mean over the code edits' prompts and overall)",
                   _with_edits(speedup_table(sub, "category", tasks), sub,
                               lambda r: speedup_table(r, "category")), rows)
    lines += _grid(f"Per task, decode speedup over `{PLAIN_LLAMA}`",
                   _with_edits(vs_llama_table(sub, tasks), sub, vs_llama_table), rows)
    ids = list(dict.fromkeys(r["prompt_id"] for r in recs))
    lines += _grid("Per prompt (median over its turns), decode speedup over our plain path",
                   speedup_table(sub, "prompt_id", ids), ids)
    agent = [r for r in recs if r["category"] == "grounded-agent"]
    if agent:
        turns = sorted({int(r["turn"]) for r in agent})
        asub = {**run, "records": agent}
        lines += _grid("Agent slice per turn (turn 1 = the first request; later turns carry "
                       "the model's previous versions), over our plain path",
                       speedup_table(asub, "turn", turns), turns)
        lines += _grid(f"Agent slice per turn, over `{PLAIN_LLAMA}`",
                       vs_llama_table_by_turn(asub, turns), turns)
    return lines


def _with_edits(table: Mapping[Any, Any], run: Mapping[str, Any],
                table_of: Callable[[Mapping[str, Any]], Mapping[Any, Any]]) -> dict:
    """``table`` plus the row EDITS_ROW: the geometric mean over the code edits' prompts
    (the OVERALL cell of ``table_of`` on those records), when the run has code edits and
    other tasks too (alone, that row would repeat OVERALL)."""
    edits = [r for r in run["records"] if r["category"] in EDIT_CATEGORIES]
    if not edits or len(edits) == len(run["records"]):
        return dict(table)
    cells = table_of({**run, "records": edits}).get(OVERALL)
    return {**table, EDITS_ROW: cells} if cells else dict(table)


def vs_llama_table_by_turn(run: Mapping[str, Any], turns: Sequence[int]) -> dict:
    """vs_llama_table grouped by turn: each turn's records as a category of their own."""
    recs = [{**r, "category": f"turn {int(r['turn']) + 1}"} for r in run["records"]]
    table = vs_llama_table({**run, "records": recs}, [f"turn {t + 1}" for t in turns])
    return {(int(k.split()[1]) - 1 if k != OVERALL else k): v for k, v in table.items()}


def _grid(title: str, table: Mapping[Any, Mapping[str, Any]], groups: Sequence[Any]) -> list[str]:
    if not table:
        return []
    configs = list(next(iter(table.values())))
    label = (lambda g: f"turn {g + 1}") if groups and isinstance(groups[0], int) else str
    rows = [(label(g) if g != OVERALL else OVERALL, *(_x(table[g][c]) for c in configs))
            for g in [*groups, OVERALL] if g in table]
    out = [f"### {title}", "", "| | " + " | ".join(configs) + " |",
           "|---" * (len(configs) + 1) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out + [""]


__all__ = ["EDIT_CATEGORIES", "EDITS_ROW", "SETS", "SOURCES", "TASKS", "GroundedSet", "Source",
           "Task", "build", "digest", "estimated_tokens", "plant_bug", "read_source",
           "report_section"]
