"""Repacked or plain CPU weights for the default mode? (docs/benchmarks.md)

Loads the target twice in one process, once per weight layout, and runs each prompt
interleaved (rotating order) four ways: the plain path and the default (``auto``) on each
layout. Every speedup is paired against the repacked plain path, the engine's default, so
a layout's own step speed counts too. The planner picks the repacked layout today; on a
CPU whose curve is flatter without repacking this says what the other would give.

    python tools/layout_ab.py ~/.cache/edgespec/models/qwen-1.5b.gguf \\
        --categories summarization,rag,math_reasoning,writing --per-category 3 --humanevalfix 4
"""

from __future__ import annotations

import argparse
import statistics

from edgespec.lab.bench.prompts import load_humanevalfix, load_spec_bench
from edgespec.runtime.kernel import KernelConfig
from edgespec.engine.engine import Engine
from edgespec.api.params import GenerationParams
from edgespec.api.stats import geometric_mean as geomean

ARMS = (("repacked", "none"), ("repacked", "auto"), ("plain", "none"), ("plain", "auto"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--categories", default="summarization,rag,math_reasoning,writing")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--humanevalfix", type=int, default=4)
    a = ap.parse_args()
    prompts = (load_spec_bench(categories=a.categories.split(","), per_category=a.per_category,
                               max_turns=1) + load_humanevalfix(n=a.humanevalfix))
    params = GenerationParams(max_tokens=a.tokens)
    engines = {"repacked": Engine.load(a.model, threads=a.threads, kernel=KernelConfig(repack=True)),
               "plain": Engine.load(a.model, threads=a.threads, kernel=KernelConfig(repack=False))}
    ratios: dict[tuple[str, str], dict[str, list[float]]] = {}
    try:
        for i, bp in enumerate(prompts):
            msgs = bp.messages([])
            order = ARMS[i % len(ARMS):] + ARMS[:i % len(ARMS)]
            rate = {}
            for layout, proposer in order:
                # "auto" is what the engine loaded for it (its default label)
                fin = engines[layout].generate(msgs, params, reuse=False,
                                               proposer=None if proposer == "auto" else proposer)
                rate[(layout, proposer)] = fin.stats.decode_tokens_per_second
            base = rate[("repacked", "none")]
            print(f"{bp.id} ({bp.category}): " + ", ".join(
                f"{l}/{p} {r / base:.2f}" for (l, p), r in rate.items()), flush=True)
            for arm, r in rate.items():
                ratios.setdefault(arm, {}).setdefault(bp.category, []).append(r / base)
    finally:
        for e in engines.values():
            e.close()
    print("\nratio to the repacked plain path: geomean over prompts; median per category")
    cats = list(dict.fromkeys(bp.category for bp in prompts))
    print("| arm | all | " + " | ".join(cats) + " |")
    print("|---|---|" + "---|" * len(cats))
    for arm in ARMS:
        per = ratios[arm]
        g = geomean(x for c in cats for x in per[c])
        print(f"| {arm[0]} weights, {arm[1]} | {g:.2f} | "
              + " | ".join(f"{statistics.median(per[c]):.2f}" for c in cats) + " |")


if __name__ == "__main__":
    main()
