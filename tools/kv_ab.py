"""Prompt processing and decode by KV cache type, ours beside llama-completion (docs/benchmarks.md).

The bench runs ``llama-completion`` with llama.cpp's own defaults (an F16 KV cache), and our
plain path with the engine's kernel configuration. This times, interleaved in rotating
order, at a few prompt lengths:

* ``ours-q8_0`` / ``ours-f16``: a fresh context of our runtime with that KV cache (flash
  attention on, the engine's batch), one prefill of the prompt and single-token greedy steps;
* ``llama-default``: llama-completion with llama.cpp's defaults (what the bench compares with);
* ``llama-q8_0``: llama-completion with our Q8_0 flags.

Prefill and decode tokens/s are the tools' own timers for llama-completion, wall clock
around the calls for ours. Medians over rounds, ratios to ``llama-default``.

    python tools/kv_ab.py ~/.cache/edgespec/models/qwen-1.5b.gguf --threads 2 --rounds 3
"""
from __future__ import annotations

import argparse
import difflib
import inspect
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from edgespec.lab.bench.tools import check_built, tool_path
from edgespec.runtime.kernel import KV_GGML_TYPE
from edgespec.runtime.model import load_model

N_CTX, N_BATCH = 4096, 512


def ours(ctx, toks: list[int], n: int) -> tuple[float, float]:
    ctx.clear()
    t = time.perf_counter()
    logits = ctx.decode(toks, 0)
    prefill = time.perf_counter() - t
    tok, pos = int(np.argmax(logits[0])), len(toks)
    t = time.perf_counter()
    for _ in range(n - 1):
        tok = int(np.argmax(ctx.decode([tok], pos)[0]))
        pos += 1
    return len(toks) / prefill, (n - 1) / (time.perf_counter() - t)


def llama(binary: Path, model: Path, prompt: bytes, n: int, threads: int,
          flags: list[str]) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(prompt + b"\n")  # -f drops one trailing newline
        f.flush()
        err = subprocess.run(
            [str(binary), "-m", str(model), "-f", f.name, "-n", str(n), "-c", str(N_CTX),
             "-b", str(N_CTX), "-ub", str(N_BATCH), "-t", str(threads), "-tb", str(threads),
             "--no-escape", "--seed", "0", "-ngl", "0", "--temp", "0", "--top-k", "1",
             "-no-cnv", "--no-display-prompt", *flags],
            capture_output=True, text=True, check=True).stderr
    pe = re.search(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens", err)
    ev = re.search(r"\s eval time =\s+([\d.]+) ms /\s+(\d+) runs", err)
    if pe is None or ev is None:
        raise SystemExit(f"llama-completion printed no timings:\n{err[-2000:]}")
    return int(pe.group(2)) / float(pe.group(1)) * 1e3, int(ev.group(2)) / float(ev.group(1)) * 1e3


def long_text(model, n: int = 0) -> list[int]:
    """A real, long text's tokens (difflib's source), refused when shorter than ``n``."""
    text = model.tokenize(inspect.getsource(difflib), add_special=False)
    if len(text) < n:
        raise SystemExit(f"the text has {len(text)} tokens, fewer than {n}")
    return text


def interleaved(names: list[str], lengths: list[int], rounds: int,
                run: Callable[[str, int], tuple[float, float]]
                ) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """(prefill, decode) tok/s of every arm at every prompt length, a round at a time, the
    arms in an order that rotates by one each round (a slow drift hits each arm alike)."""
    got: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(rounds):
        for n in lengths:
            for name in names[r % len(names):] + names[:r % len(names)]:
                pf, dc = run(name, n)
                got.setdefault((name, n), []).append((pf, dc))
                print(f"round {r} n={n} {name}: prefill {pf:.1f} tok/s, decode {dc:.2f} tok/s",
                      flush=True)
    return got


def report(got: dict[tuple[str, int], list[tuple[float, float]]], names: list[str],
           lengths: list[int], base: str) -> None:
    """Medians over rounds per arm and length, with ratios to the ``base`` arm."""
    print(f"\nmedians over rounds, ratios to {base}")
    width = max(len(name) for name in names)
    for n in lengths:
        bp = statistics.median(x[0] for x in got[(base, n)])
        bd = statistics.median(x[1] for x in got[(base, n)])
        for name in names:
            p = statistics.median(x[0] for x in got[(name, n)])
            d = statistics.median(x[1] for x in got[(name, n)])
            print(f"n={n:5d} {name:{width}s} prefill {p:6.1f} tok/s ({p / bp:.2f}x)  "
                  f"decode {d:6.2f} tok/s ({d / bd:.3f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="tokens decoded per run")
    ap.add_argument("--lengths", default="300,1000,2000", help="prompt lengths in tokens")
    a = ap.parse_args()
    binary = tool_path(check_built(["llama-completion"]), "llama-completion")
    lengths = [int(x) for x in a.lengths.split(",")]
    model = load_model(a.model, use_mmap=False)
    text = long_text(model, max(lengths))
    ctxs = {kv: model.new_context(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=a.threads,
                                  flash_attn=1, type_k=KV_GGML_TYPE[kv], type_v=KV_GGML_TYPE[kv])
            for kv in ("q8_0", "f16")}
    arms = {
        "ours-q8_0": lambda t: ours(ctxs["q8_0"], t, a.tokens),
        "ours-f16": lambda t: ours(ctxs["f16"], t, a.tokens),
        "llama-default": lambda t: llama(binary, a.model, model.detokenize(t), a.tokens,
                                         a.threads, []),
        "llama-q8_0": lambda t: llama(binary, a.model, model.detokenize(t), a.tokens, a.threads,
                                      ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]),
    }
    got = interleaved(list(arms), lengths, a.rounds, lambda name, n: arms[name](text[:n]))
    report(got, list(arms), lengths, "llama-default")

if __name__ == "__main__":
    main()
