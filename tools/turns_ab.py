"""The default mode's KV cache type on an editor agent's conversations (docs/benchmarks.md).

The grounded preset's agent slice (one stdlib function rewritten over 3-5 turns, each turn
carrying the model's previous answers) through the default mode with a Q8_0 and with an F16
KV cache, flash attention on both, greedy, prefix reuse warm as an agent's would be, and the
idle-time refresh after each turn (what `edgespec serve` and `edgespec chat` do while an
answer is read). Rounds interleave the two caches in rotating order. Per turn: prompt tokens,
reused, computed, prefill and end-to-end seconds; medians over rounds, ratios F16 / Q8_0.

    python tools/turns_ab.py ~/.cache/edgespec/models/qwen-1.5b.gguf --threads 2 --rounds 2
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from edgespec.api.params import GenerationParams
from edgespec.apps import state
from edgespec.engine.engine import Engine
from edgespec.lab.bench import grounded
from edgespec.runtime.kernel import KernelConfig

KV = ("q8_0", "f16")


def conversation(eng: Engine, prompt, max_tokens: int) -> list[dict]:
    state.reset(eng)  # each conversation starts cold, as a new agent session would
    answers: list[str] = []
    rows = []
    params = GenerationParams(max_tokens=max_tokens)
    for turn in range(len(prompt.turns)):
        t = time.perf_counter()
        fin = eng.generate(prompt.messages(answers), params, reuse=True)
        wall = time.perf_counter() - t
        answers.append(fin.text)
        s = fin.stats
        rows.append(dict(turn=turn + 1, prompt=s.prompt_tokens, reused=s.prompt_reused,
                         prefill=s.prefill_seconds, wall=wall, tokens=list(fin.tokens)))
        t = time.perf_counter()
        rows[-1]["refreshed"] = eng.refresh_kv()
        rows[-1]["refresh_s"] = time.perf_counter() - t
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=8192)
    a = ap.parse_args()
    prompts = [p for p in grounded.build("all").prompts if p.category == "grounded-agent"]
    engines = {kv: Engine.load(a.model, threads=a.threads, n_ctx=a.ctx,
                               kernel=KernelConfig(kv_type=kv, flash_attn=True)) for kv in KV}
    got: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for r in range(a.rounds):
        for i, p in enumerate(prompts):
            order = KV if (r + i) % 2 == 0 else KV[::-1]
            for kv in order:
                for row in conversation(engines[kv], p, a.max_tokens):
                    got[(p.id, kv, row["turn"])].append(row)
                print(f"round {r + 1} {p.id} {kv} done", flush=True)
    print("\n| task | turn | prompt | reused Q8_0 / F16 | prefill s Q8_0 / F16 | end to end s Q8_0 / F16 | F16 ÷ Q8_0 end to end | same text |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for p in prompts:
        for turn in range(1, len(p.turns) + 1):
            q, f = got[(p.id, "q8_0", turn)], got[(p.id, "f16", turn)]
            med = lambda rows, k: statistics.median(x[k] for x in rows)  # noqa: E731
            ratio = med(q, "wall") / med(f, "wall")
            ratios.append(ratio)
            same = "yes" if q[0]["tokens"] == f[0]["tokens"] else "no"
            print(f"| {p.id.split('/', 1)[1]} | {turn} | {q[0]['prompt']} | "
                  f"{int(med(q, 'reused'))} / {int(med(f, 'reused'))} | "
                  f"{med(q, 'prefill'):.1f} / {med(f, 'prefill'):.1f} | "
                  f"{med(q, 'wall'):.1f} / {med(f, 'wall'):.1f} | {ratio:.2f}× | {same} |")
    geo = statistics.geometric_mean(ratios)
    print(f"\ngeomean speed F16 ÷ Q8_0 end to end over {len(ratios)} turns: {geo:.3f}×")
    for eng in engines.values():
        eng.close()


if __name__ == "__main__":
    main()
