"""Microbenchmark of the native proposers next to llama-cpp-python's prompt lookup.

For contexts of 1k, 8k and 32k tokens (the same synthetic input-grounded
streams for everyone: Zipf-distributed tokens with spans copied from earlier in
the stream) it reports:

* propose / speculate / n-gram-statistics draft latency per call, through the
  binding (the C call plus the Python boundary) and through a proposer session
  (what the engine pays);
* the cost of extending the index per token: in bulk (the prompt) and one
  step at a time at that context length (accept() in the decode loop);
* ``LlamaPromptLookupDecoding`` (llama_cpp.llama_speculative) per call on the
  same streams, and the speed-up of the native n-gram index over it.

Usage: python native/bench_native.py [--sizes 1000,8000,32000] [--clock cpu|wall] [--json F]
Timings are the best of several repeats. The default clock is this process's
CPU time, which a busy shared machine inflates less than wall time; on a quiet
machine the two agree. Either way the figures are indicative.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from edgespec import _native
from edgespec.api.params import SamplingParams
from edgespec.proposers.ngram import NgramProposer
from edgespec.proposers.suffix import SuffixProposer

K = 10  # draft tokens asked per call (LlamaPromptLookupDecoding's default)


def make_stream(n: int, seed: int, vocab: int = 32_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < n:
        span = int(rng.integers(4, 40))
        if len(out) > 64 and rng.random() < 0.5:
            start = int(rng.integers(0, len(out) - span))
            out.extend(out[start:start + span])  # the output quotes its input
        else:
            out.extend((rng.zipf(1.3, size=span) % vocab).tolist())
    return np.asarray(out[:n], dtype=np.int32)


CLOCK = time.process_time


def best_per_call(fn, calls: int, repeats: int = 5) -> float:
    """Seconds per call of fn(i) for i in range(calls), best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        t0 = CLOCK()
        for i in range(calls):
            fn(i)
        best = min(best, (CLOCK() - t0) / calls)
    return best


def bench_size(L: int, calls: int) -> dict:
    stream = make_stream(L + 4 * calls, seed=L)
    ctx, tail = stream[:L], stream[L:].tolist()
    res: dict = {"context": L}

    # --- n-gram: bulk build, per-step extend, propose --------------------------------
    def build_ngram():
        ix = _native.NgramIndex(2, 5, 1 << 30)
        ix.extend(ctx)
        return ix

    t0 = CLOCK()
    ix = build_ngram()
    res["ngram_build_ns_per_token"] = (CLOCK() - t0) / L * 1e9
    res["ngram_memory_bytes_per_token"] = ix.memory_usage() / len(ix)
    res["ngram_extend_us_per_token"] = best_per_call(lambda i: ix.extend(tail[i:i + 1]), calls,
                                                      repeats=1) * 1e6
    ix = build_ngram()
    res["ngram_propose_us"] = best_per_call(lambda i: ix.propose(K), calls) * 1e6
    ix12 = _native.NgramIndex(1, 2, 1 << 30)  # the orders llama's lookup tries
    ix12.extend(ctx)
    res["ngram12_propose_us"] = best_per_call(lambda i: ix12.propose(K), calls) * 1e6

    # --- n-gram statistics (the ngram proposer's default): build, draft --------------
    t0 = CLOCK()
    st = _native.NgramStats(2, 6, 1 << 30)
    st.extend(ctx)
    res["stats_build_ns_per_token"] = (CLOCK() - t0) / L * 1e9
    res["stats_memory_bytes_per_token"] = st.memory_usage() / L
    bar = _native.ngram_params([0], [1], [0.5, 0.6, 0.7, 0.8, 0.9, 1.0], [2], [0.66])
    res["stats_draft_us"] = best_per_call(lambda i: _native.ngram_draft(st, None, K, bar), calls) * 1e6

    # the engine's view: one propose and one accept per step through the session
    prop = NgramProposer(max_draft=K)
    for r in range(40):  # earlier generations for the dynamic statistics
        prop.dynamic.remember([0], make_stream(500, seed=20_000 + r).tolist())
    sess = prop.open(ctx, SamplingParams())
    res["ngram_session_step_us"] = best_per_call(
        lambda i: (sess.propose(K), sess.accept(tail[i:i + 1], 0)), calls, repeats=1) * 1e6
    sess = NgramProposer(max_draft=K, statistics=False).open(ctx, SamplingParams())
    res["lookup_session_step_us"] = best_per_call(
        lambda i: (sess.propose(K), sess.accept(tail[i:i + 1], 0)), calls, repeats=1) * 1e6

    # --- suffix: request tree and global tree ----------------------------------------
    t = _native.SuffixTree(64, 1 << 31)
    t.begin()
    t0 = CLOCK()
    t.extend(ctx)
    res["suffix_build_ns_per_token"] = (CLOCK() - t0) / L * 1e9
    res["suffix_extend_us_per_token"] = best_per_call(lambda i: t.extend(tail[i:i + 1]), calls,
                                                       repeats=1) * 1e6
    res["suffix_memory_bytes_per_token"] = t.memory_usage() / t.num_tokens
    res["suffix_speculate_us"] = best_per_call(
        lambda i: _native.speculate(t, None, K, 1.0, 0.0, 0.1), calls) * 1e6

    prop = SuffixProposer(max_draft=K)
    for r in range(40):  # earlier responses for the global tree
        prop.remember(make_stream(500, seed=10_000 + r).tolist())
    sess = prop.open(ctx, SamplingParams())
    res["suffix_session_step_us"] = best_per_call(
        lambda i: (sess.propose(K), sess.accept(tail[i:i + 1], 0)), calls, repeats=1) * 1e6
    res["suffix_speculate_both_us"] = best_per_call(lambda i: sess.propose(K), calls) * 1e6

    # --- llama-cpp-python's prompt lookup on the same context --------------------------
    try:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        res["llama_lookup_us"] = None
    else:
        lookup = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=K)
        ids = ctx.astype(np.intc)
        n = max(5, min(calls, 200_000 // max(L, 1)))
        res["llama_lookup_us"] = best_per_call(lambda i: lookup(ids), n, repeats=3) * 1e6
        res["speedup_vs_llama"] = res["llama_lookup_us"] / res["ngram12_propose_us"]
        res["speedup_vs_llama_session"] = res["llama_lookup_us"] / res["lookup_session_step_us"]
    return res


ROWS = [
    ("n-gram propose (C via binding, n=2..5)", "ngram_propose_us", "µs"),
    ("n-gram propose (C via binding, n=1..2)", "ngram12_propose_us", "µs"),
    ("prompt-lookup session step: propose + accept", "lookup_session_step_us", "µs"),
    ("n-gram extend, one token per call", "ngram_extend_us_per_token", "µs"),
    ("n-gram build, bulk", "ngram_build_ns_per_token", "ns/token"),
    ("n-gram index memory", "ngram_memory_bytes_per_token", "B/token"),
    ("n-gram statistics draft (C via binding, n=2..6)", "stats_draft_us", "µs"),
    ("n-gram statistics session step (context + dynamic)", "ngram_session_step_us", "µs"),
    ("n-gram statistics build, bulk", "stats_build_ns_per_token", "ns/token"),
    ("n-gram statistics memory", "stats_memory_bytes_per_token", "B/token"),
    ("suffix speculate, request tree (binding)", "suffix_speculate_us", "µs"),
    ("suffix propose, request + global tree", "suffix_speculate_both_us", "µs"),
    ("suffix session step: propose + accept", "suffix_session_step_us", "µs"),
    ("suffix extend, one token per call", "suffix_extend_us_per_token", "µs"),
    ("suffix build, bulk (depth 64)", "suffix_build_ns_per_token", "ns/token"),
    ("suffix request tree memory", "suffix_memory_bytes_per_token", "B/token"),
    ("LlamaPromptLookupDecoding call (n=1..2)", "llama_lookup_us", "µs"),
    ("speed-up, n-gram propose vs llama", "speedup_vs_llama", "×"),
    ("speed-up, prompt-lookup session step vs llama", "speedup_vs_llama_session", "×"),
]


def table(results: list[dict]) -> str:
    head = "| | " + " | ".join(f"{r['context']:,} tokens" for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    for label, key, unit in ROWS:
        cells = []
        for r in results:
            v = r.get(key)
            cells.append("n/a" if v is None else f"{v:,.0f} {unit}" if v >= 100 else
                         f"{v:.2f} {unit}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,8000,32000")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    results = [bench_size(int(s), args.calls) for s in args.sizes.split(",")]
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
