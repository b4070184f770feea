"""Where does the plain path's gap to llama-completion sit? (docs/benchmarks.md)

Alternates, in one process, on one prompt:

* ``engine``: the engine's plain generation (proposer "none"), decode tokens/s as the
  bench reports it (wall clock of the whole loop: Python, detokenizing, events);
* ``bare``: single-token ``Context.decode`` calls and an argmax on the engine's context;
* ``bare-1seq``: the same loop on a fresh single-sequence context the tool makes itself
  (the engine's context holds more sequences with ``--tree-width`` or ``parallel``, and it
  has served requests: this rules out its layout and its history);
* ``llama-completion`` (with ``make anchors`` built): llama.cpp's own plain decode of the
  same text with the same context size, threads, KV type, flash attention and repacking,
  timed as the bench times it (its decode and sampling timers).

* ``llama-completion-shared`` (with ``--shared-bin DIR``): the same tool built from the same
  source and flags as shared libraries (``-DBUILD_SHARED_LIBS=ON``), as llama-cpp-python
  builds llama.cpp; ``make anchors`` links its tools statically.

``engine`` = ``bare`` puts the gap outside our per-step code; ``bare`` = ``bare-1seq``
outside the context's layout; what remains is between llama-cpp-python's build of
llama.cpp and the tool's, and the shared arm tests the one build difference there is.

    python tools/plain_overhead.py ~/.cache/edgespec/models/qwen-1.5b.gguf --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgespec.lab.bench.anchors.paths import anchors_bin_dir
from edgespec.lab.bench.tools import AnchorsNotBuiltError, check_built, run_tool, setup_from_engine
from edgespec.engine.engine import Engine
from edgespec.api.params import GenerationParams

# raw text (no chat template) that a model continues for a long time, so every arm
# generates the full count and the tool reads exactly the same tokens
PROMPT = ("The history of the city begins in the early medieval period, when a small "
          "settlement grew up around a river crossing. Over the following centuries")


def bare_loop(ctx, tokens: list[int], n: int) -> float:
    ctx.clear()
    tok = int(np.argmax(ctx.decode(tokens, 0)[0]))
    pos = len(tokens)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        tok = int(np.argmax(ctx.decode([tok], pos)[0]))
        pos += 1
    rate = (n - 1) / (time.perf_counter() - t0)
    ctx.clear()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shared-bin", default=None,
                    help="folder of a llama-completion built with -DBUILD_SHARED_LIBS=ON")
    a = ap.parse_args()
    params = GenerationParams(max_tokens=a.tokens, chat=False)
    rates: dict[str, list[float]] = {}
    with Engine.load(a.model, proposer="none", threads=a.threads) as engine:
        tokens = engine.prompt_tokens(PROMPT, params)
        one = engine.target.new_context(n_ctx=engine.ctx.n_ctx, n_batch=engine.ctx.n_batch,
                                        n_threads=a.threads, n_seq_max=1)
        try:
            bin_dir = check_built(["llama-completion"], anchors_bin_dir())
            setup = setup_from_engine(engine, bin_dir)
        except AnchorsNotBuiltError as e:
            print(f"llama-completion left out: {e}")
            setup = None
        shared = None
        if a.shared_bin and setup is not None:
            shared = replace(setup, bin_dir=check_built(["llama-completion"], Path(a.shared_bin)))
        try:
            for r in range(a.rounds):
                fin = engine.generate(PROMPT, params, reuse=False)
                row = {"engine": fin.stats.decode_tokens_per_second,
                       "bare": bare_loop(engine.ctx, tokens, a.tokens)}
                engine.kv_cache.invalidate()  # the engine must not reuse a prefix bare cleared
                row["bare-1seq"] = bare_loop(one, tokens, a.tokens)
                if setup is not None:
                    run = run_tool("llama-completion", setup, PROMPT, a.tokens)
                    if run.timing.prompt_tokens != len(tokens):
                        raise SystemExit(f"llama-completion read {run.timing.prompt_tokens} prompt "
                                         f"tokens, the engine {len(tokens)}")
                    row["llama-completion"] = run.timing.decode_tokens_per_second
                if shared is not None:
                    run = run_tool("llama-completion", shared, PROMPT, a.tokens)
                    row["llama-completion-shared"] = run.timing.decode_tokens_per_second
                print(f"round {r}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items())
                      + f" tok/s (engine generated {len(fin.tokens)})")
                for k, v in row.items():
                    rates.setdefault(k, []).append(v)
        finally:
            one.close()
    # paired per round: the machine's drift between rounds cancels
    print("median tok/s, and median per-round ratio to the engine's plain path:")
    for k, v in rates.items():
        ratio = statistics.median(x / e for x, e in zip(v, rates["engine"]))
        print(f"  {k:17s} {statistics.median(v):6.2f}  {ratio:.3f}")


if __name__ == "__main__":
    main()
