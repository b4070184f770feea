"""A bench run's plain outputs as replay traces (docs/benchmarks.md, the copy bound).

Every ``bench.json`` keeps the tokens each plain ("none") request generated. With the
prompts re-tokenized the way the run tokenized them (the token count is checked against
the record), they become :class:`edgespec.lab.replay.generations.Trace` records that
``python -m edgespec.lab.replay.generations`` replays: the same prompts and outputs the real run
measured, for asking what any proposer or controller could have done on them.

    python tools/bench_traces.py docs/bench/standard-intel-2026-12-01/bench.json \\
        ~/.cache/edgespec/models/qwen-1.5b.gguf -o /tmp/standard-traces.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgespec.lab.bench.prompts import load_humanevalfix, load_spec_bench
from edgespec.engine.engine import Engine
from edgespec.api.params import GenerationParams
from edgespec.lab.replay.generations import Trace, save_traces


def plain_outputs(records: list[dict]) -> dict[str, tuple[int, list[int]]]:
    """prompt id -> (prompt token count, generated tokens) of its first-turn plain runs;
    greedy plain runs of one prompt must agree, so a disagreement is an error."""
    out: dict[str, tuple[int, list[int]]] = {}
    for r in records:
        if r.get("config") != "none" or r.get("kind") != "engine" or r.get("turn", 0) != 0:
            continue
        if not r.get("tokens"):
            continue
        seen = out.setdefault(r["prompt_id"], (r["prompt_tokens"], r["tokens"]))
        if seen[1] != r["tokens"]:
            raise SystemExit(f"{r['prompt_id']}: two plain runs generated different tokens; "
                             "was the run greedy?")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("model", help="the run's target GGUF (tokenizes the prompts)")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    run = json.loads(Path(a.bench_json).read_text(encoding="utf-8"))
    outputs = plain_outputs(run["records"])
    prompts = {p.id: p for p in load_spec_bench(max_turns=1) + load_humanevalfix()}
    traces = []
    with Engine.load(a.model, proposer="none", threads=1) as engine:
        for pid, (n_prompt, tokens) in outputs.items():
            if pid not in prompts:
                print(f"{pid}: not in the shipped prompt sets, left out", file=sys.stderr)
                continue
            bp = prompts[pid]
            toks = engine.prompt_tokens(bp.messages([]), GenerationParams())
            if len(toks) != n_prompt:
                raise SystemExit(f"{pid}: {len(toks)} prompt tokens here, {n_prompt} in the run "
                                 "(another model or template?)")
            traces.append(Trace(name=pid, prompt=tuple(toks), output=tuple(tokens),
                                category=bp.category))
    save_traces(traces, a.out)
    print(f"{len(traces)} traces -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
