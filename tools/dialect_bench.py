"""Speculation through every dialect: the same code edit and fill-in-the-middle requests sent
through each protocol `edgespec serve` speaks, against the plain path, on one model.

    .venv/bin/python tools/dialect_bench.py --target qwen-1.5b --rounds 2 --out /tmp/dialects

Two servers on loopback, the default (lossless speculation) and `--proposer none` (the plain
path), one at a time (an idle llama.cpp server beside a busy one still takes cycles on a
small CPU); each round sends every request to each, alternating which server goes first
between rounds, one request at a time (run it on a quiet machine).
Reported per (dialect, task): output tokens, the plain and default decode rates (output tokens
over the request's wall time, prompt included, as a client sees it), their ratio, and the
drafted/accepted tokens the server's /metrics counted for that request. Greedy, so both
servers answer the same text up to near-ties (docs/parity.md); the table says where the texts
differ.

The dialects: OpenAI chat and completions (with `suffix` for FIM), Anthropic Messages, the
Responses API, Ollama's /api/chat and /api/generate (with `suffix`), llama.cpp's /completion
and /infill. FIM needs a model with FIM tokens (Qwen2.5-Coder has them).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import ServeProcess  # noqa: E402  (the tools' one loopback server runner)

EDIT = '''Here is a Python function. Add type hints to its signature and return the whole function, unchanged otherwise.

def merge_counts(a, b):
    """Merge two word-count dictionaries into a new one."""
    out = dict(a)
    for word, count in b.items():
        if word in out:
            out[word] = out[word] + count
        else:
            out[word] = count
    keys = sorted(out)
    result = {}
    for k in keys:
        result[k] = out[k]
    return result
'''
FIM_PREFIX = '''def merge_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Merge two word-count dictionaries into a new one."""
    out = dict(a)
    for word, count in b.items():
'''
FIM_SUFFIX = '''
    keys = sorted(out)
    result = {}
    for k in keys:
        result[k] = out[k]
    return result
'''


@dataclass
class Call:
    """One request in one dialect: the route, its body, and how to read its answer."""

    dialect: str
    task: str
    path: str
    body: dict
    text: "callable"
    tokens: "callable"
    headers: dict = field(default_factory=dict)


def calls(model: str, n: int) -> list[Call]:
    msgs = [{"role": "user", "content": EDIT}]
    return [
        Call("openai-chat", "edit", "/v1/chat/completions",
             {"model": model, "messages": msgs, "max_tokens": n, "temperature": 0},
             lambda b: b["choices"][0]["message"]["content"],
             lambda b: b["usage"]["completion_tokens"]),
        Call("openai-completions", "fim", "/v1/completions",
             {"model": model, "prompt": FIM_PREFIX, "suffix": FIM_SUFFIX, "max_tokens": n,
              "temperature": 0},
             lambda b: b["choices"][0]["text"], lambda b: b["usage"]["completion_tokens"]),
        Call("anthropic", "edit", "/v1/messages",
             {"model": model, "messages": msgs, "max_tokens": n, "temperature": 0},
             lambda b: "".join(c.get("text", "") for c in b["content"]),
             lambda b: b["usage"]["output_tokens"], {"anthropic-version": "2023-06-01"}),
        Call("responses", "edit", "/v1/responses",
             {"model": model, "input": EDIT, "max_output_tokens": n, "temperature": 0},
             lambda b: "".join(c.get("text", "") for item in b["output"]
                               for c in item.get("content", []) or []),
             lambda b: b["usage"]["output_tokens"]),
        Call("ollama-chat", "edit", "/api/chat",
             {"model": model, "messages": msgs, "stream": False,
              "options": {"num_predict": n, "temperature": 0}},
             lambda b: b["message"]["content"], lambda b: b["eval_count"]),
        Call("ollama-generate", "fim", "/api/generate",
             {"model": model, "prompt": FIM_PREFIX, "suffix": FIM_SUFFIX, "stream": False,
              "options": {"num_predict": n, "temperature": 0}},
             lambda b: b["response"], lambda b: b["eval_count"]),
        Call("llamacpp-completion", "edit", "/completion",
             {"prompt": EDIT, "n_predict": n, "temperature": 0},
             lambda b: b["content"], lambda b: b["tokens_predicted"]),
        Call("llamacpp-infill", "fim", "/infill",
             {"input_prefix": FIM_PREFIX, "input_suffix": FIM_SUFFIX, "n_predict": n,
              "temperature": 0},
             lambda b: b["content"], lambda b: b["tokens_predicted"]),
    ]


_METRIC = re.compile(r"^(edgespec_spec_decode_num_(?:draft|accepted)_tokens)_total(?:\{[^}]*\})?"
                     r" ([0-9.e+-]+)$", re.M)


def drafted_accepted(server: ServeProcess) -> tuple[float, float]:
    status, _, body = server.request("GET", "/metrics")
    if status != 200:
        return math.nan, math.nan
    got: dict[str, float] = {}
    for name, value in _METRIC.findall(body.decode()):
        got[name] = got.get(name, 0.0) + float(value)
    return (got.get("edgespec_spec_decode_num_draft_tokens", 0.0),
            got.get("edgespec_spec_decode_num_accepted_tokens", 0.0))


class Refused(Exception):
    """The server refused a task it cannot serve on this model (its message says why)."""


@dataclass
class Sample:
    seconds: float
    tokens: int
    text: str
    drafted: float
    accepted: float


def run_one(server: ServeProcess, call: Call) -> Sample:
    d0, a0 = drafted_accepted(server)
    t0 = time.perf_counter()
    status, _, body = server.request("POST", call.path, call.body, call.headers, timeout=600)
    seconds = time.perf_counter() - t0
    if status in (400, 501) and b"fim" in body.lower():
        raise Refused(body[:300].decode(errors="replace"))
    if status != 200:
        raise RuntimeError(f"{call.dialect} {call.path}: HTTP {status}: {body[:300]!r}")
    b = json.loads(body)
    d1, a1 = drafted_accepted(server)
    return Sample(seconds, int(call.tokens(b)), call.text(b), d1 - d0, a1 - a0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen-1.5b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dialects", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--out", type=Path, default=None, help="folder for report.md and runs.json")
    args = ap.parse_args(argv)
    common = ["-m", args.target, "--max-tokens-limit", str(max(args.max_tokens, 16))]
    if args.threads:
        common += ["-t", str(args.threads)]
    model = Path(args.target).stem if args.target.endswith(".gguf") else args.target
    chosen = calls(model, args.max_tokens)
    if args.dialects:
        keep = set(args.dialects.split(","))
        chosen = [c for c in chosen if c.dialect in keep]
    runs: dict[tuple[str, str], dict[str, list[Sample]]] = {}
    flags = {"plain": ["--proposer", "none"], "default": []}
    for r in range(args.rounds):
        # one server at a time: on a small CPU an idle llama.cpp server beside a busy one
        # still takes cycles, so the two are never up together; the order alternates
        for name in (["plain", "default"] if r % 2 == 0 else ["default", "plain"]):
            with ServeProcess(common + flags[name], startup_seconds=900) as server:
                for c in list(chosen):
                    try:
                        s = run_one(server, c)
                    except Refused as e:  # FIM on a model without FIM tokens, say
                        print(f"{c.dialect}: refused, left out: {e}", flush=True)
                        chosen.remove(c)
                        runs.pop((c.dialect, c.task), None)
                        continue
                    runs.setdefault((c.dialect, c.task), {}).setdefault(name, []).append(s)
                    print(f"round {r + 1} {c.dialect:20s} {name:8s} {s.tokens:4d} tok "
                          f"{s.tokens / s.seconds:6.1f} tok/s drafted {s.drafted:.0f} "
                          f"accepted {s.accepted:.0f}", flush=True)
    report = render(runs, args)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(report, encoding="utf-8")
        (args.out / "runs.json").write_text(json.dumps(
            {f"{d}/{t}": {k: [vars(s) for s in v] for k, v in by.items()}
             for (d, t), by in runs.items()}, indent=1), encoding="utf-8")
    return 0


def _rate(samples: list[Sample]) -> float:
    return statistics.median(s.tokens / s.seconds for s in samples)


def render(runs, args) -> str:
    lines = [f"# Speculation through every dialect ({args.target}, greedy, {args.max_tokens} "
             f"tokens, {args.rounds} rounds, medians)", "",
             "| dialect | task | tokens | plain tok/s | default tok/s | default ÷ plain | "
             "drafted | accepted | same text |", "|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for (dialect, task), by in runs.items():
        p, d = by["plain"], by["default"]
        ratio = _rate(d) / _rate(p)
        ratios.append(ratio)
        drafted = sum(s.drafted for s in d)
        accepted = sum(s.accepted for s in d)
        same = all(a.text == b.text for a, b in zip(p, d))
        lines.append(f"| {dialect} | {task} | {d[0].tokens} | {_rate(p):.1f} | {_rate(d):.1f} | "
                     f"{ratio:.2f}× | {drafted:.0f} | {accepted:.0f} | "
                     f"{'yes' if same else 'no'} |")
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines += ["", f"Geometric mean of default ÷ plain: {geo:.2f}×."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
