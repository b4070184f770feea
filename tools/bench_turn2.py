"""Turn-2 time to first token of the two-turn MT-bench questions in Spec-Bench: with prefix reuse
(default mode; --exact without and with the idle-time KV refresh), without reuse, and
llama-cpp-python's LlamaRAMCache on the same questions, interleaved per question in one process.

    nice -n 19 .venv/bin/python tools/bench_turn2.py --target qwen-1.5b --threads 1 \\
        --questions 10 --answer-tokens 128 --out turn2.json

Per question: turn 1 is answered once (greedy, exact: the plain path's answer) and the
target's KV state after it is kept; each configuration starts from that state (restored with
llama.cpp's sequence state API) and asks turn 2:

    none            the whole conversation prefilled (reuse off)
    default         reuse of everything the KV holds (the default, lossless mode)
    exact           --exact: reuse of prefill-written positions only (the answer is prefilled)
    exact+refresh   --exact after Conversation.settle's refresh of the answer (timed apart:
                    it runs while the user reads the answer, before the next message)
    llama-cpp-python   its own greedy turn 1, then ``reset()`` and turn 2, whose prefix can
                    only come from LlamaRAMCache (llama_api.anchor_ram_cache_llama)

The configurations' order rotates per question. ``--check-tokens`` greedy tokens of turn 2 are
generated for none, default and exact+refresh: exact+refresh must equal none.

Each time is taken twice: wall clock, and this process's CPU time over the same span
(``time.process_time``). With one thread on a machine that other processes load, the CPU
time still counts the work, where the wall clock counts the wait for a core too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from edgespec import Engine, GenerationParams, registry
from edgespec.lab.bench.anchors import llama_api
from edgespec.api.events import Finished, Step

ROOT = Path(__file__).resolve().parent.parent
OURS = ("none", "default", "exact", "exact+refresh")


def questions(n: int, every: int = 1) -> list[dict]:
    """The first ``n`` of every ``every``-th two-turn question (they come in categories of
    10: ``--every 10`` takes one of each category first)."""
    rows = [json.loads(line) for line in open(ROOT / "data" / "spec_bench_question.jsonl",
                                              encoding="utf-8")]
    two = [r for r in rows if len(r.get("turns", ())) >= 2]
    order = [q for k in range(every) for q in two[k::every]]
    return order[:n]


def turn2(eng: Engine, mode: str, msgs: list[dict], snapshot, check: int) -> dict:
    """One configuration's turn 2 from the state turn 1 left."""
    kv = eng.kv_cache
    tokens, state, prefilled = snapshot
    kv.invalidate()
    refresh_s = 0.0
    if mode != "none":
        assert kv.adopt(tokens, state, prefilled), "the turn-1 state was refused"
    refresh_cpu = 0.0
    if mode == "exact+refresh":
        t0, c0 = time.perf_counter(), time.process_time()
        eng.refresh_kv(exact=True)
        refresh_s, refresh_cpu = time.perf_counter() - t0, time.process_time() - c0
    n = 1 if mode == "exact" else check
    c0, cpu_ttft, fin = time.process_time(), None, None
    for ev in eng.stream(msgs, GenerationParams(max_tokens=max(n, 1)), reuse=mode != "none",
                         exact=mode != "default"):
        if cpu_ttft is None and isinstance(ev, Step) and ev.tokens:
            cpu_ttft = time.process_time() - c0
        if isinstance(ev, Finished):
            fin = ev
    s = fin.stats
    return {"ttft": s.ttft_seconds, "ttft_cpu": cpu_ttft, "reused": s.prompt_reused,
            "prompt": s.prompt_tokens, "refresh_seconds": refresh_s,
            "refresh_cpu_seconds": refresh_cpu, "tokens": list(fin.tokens) if n > 1 else None}


def anchor_turn2(anchor, eng: Engine, q: dict, answer_tokens: int) -> dict:
    p = GenerationParams(max_tokens=answer_tokens)
    msgs1 = [{"role": "user", "content": q["turns"][0]}]
    anchor.reset()
    answer, _, _ = anchor.complete(eng.prompt_tokens(msgs1, p), answer_tokens)
    msgs2 = [*msgs1, {"role": "assistant", "content": answer.strip()},
             {"role": "user", "content": q["turns"][1]}]
    prompt2 = eng.prompt_tokens(msgs2, p)
    anchor.reset()  # the prefix can only come from the RAM cache now
    c0 = time.process_time()
    _, ttft, _ = anchor.complete(prompt2, 1)  # one token: the call is its first token
    return {"ttft": ttft, "ttft_cpu": time.process_time() - c0, "prompt": len(prompt2)}


def summary(rows: list[dict]) -> dict:
    out = {}
    for clock in ("ttft", "ttft_cpu"):
        def ratios(num: str, den: str) -> list[float]:
            return [r[num][clock] / r[den][clock] for r in rows if num in r and den in r]

        for num, den in [("none", d) for d in ("default", "exact", "exact+refresh",
                                                 "llama-cpp-python")] + \
                        [("llama-cpp-python", m) for m in ("default", "exact+refresh")]:
            xs = ratios(num, den)
            if xs:
                out[f"{clock} {num}/{den}"] = {
                    "median": statistics.median(xs), "min": min(xs), "max": max(xs),
                    "geomean": statistics.geometric_mean(xs)}
    checked = [r for r in rows if r["none"].get("tokens")]
    out["exact+refresh identical to none"] = (
        f"{sum(r['exact+refresh']['tokens'] == r['none']['tokens'] for r in checked)}"
        f"/{len(checked)}")
    out["default identical to none"] = (
        f"{sum(r['default']['tokens'] == r['none']['tokens'] for r in checked)}/{len(checked)}")
    for clock in ("ttft", "ttft_cpu"):
        out[f"median {clock} seconds"] = {m: statistics.median(r[m][clock] for r in rows)
                                          for m in (*OURS, "llama-cpp-python") if m in rows[0]}
    for key in ("refresh_seconds", "refresh_cpu_seconds"):
        out[f"median {key}"] = statistics.median(r["exact+refresh"][key] for r in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen-1.5b")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--questions", type=int, default=80, help="first N two-turn questions")
    ap.add_argument("--every", type=int, default=1,
                    help="take every K-th question first (10: one per MT-bench category)")
    ap.add_argument("--answer-tokens", type=int, default=128, help="turn-1 answer cap")
    ap.add_argument("--check-tokens", type=int, default=16,
                    help="turn-2 tokens generated to compare outputs (1: TTFT only)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--no-anchor", action="store_true", help="skip llama-cpp-python")
    ap.add_argument("--out", type=Path, default=None, help="JSON with every question's figures")
    a = ap.parse_args()

    eng = Engine.load(a.target, proposer="ngram+suffix", n_ctx=a.ctx, threads=a.threads)
    eng.kv_cache.ram.budget_bytes = 0  # each configuration starts from the turn-1 state only
    anchor = None if a.no_anchor else llama_api.anchor_ram_cache_llama(
        registry.resolve(a.target), a.ctx, a.threads)
    modes = [*OURS, *([] if anchor is None else ["llama-cpp-python"])]
    print(f"target {a.target}, threads {eng.ctx.n_threads}, proposer {eng.default_proposer}, "
          f"{a.answer_tokens}-token turn-1 answers, configurations {', '.join(modes)}",
          flush=True)
    rows = []
    try:
        for i, q in enumerate(questions(a.questions, a.every)):
            p = GenerationParams(max_tokens=a.answer_tokens)
            msgs1 = [{"role": "user", "content": q["turns"][0]}]
            eng.kv_cache.invalidate()
            t1 = eng.generate(msgs1, p, reuse=True, exact=True)
            kv = eng.kv_cache
            snapshot = (list(kv.held), eng.ctx.state_get(0), kv.prefilled)
            msgs2 = [*msgs1, {"role": "assistant", "content": t1.text},
                     {"role": "user", "content": q["turns"][1]}]
            row = {"question_id": q["question_id"], "category": q["category"],
                   "answer_tokens": len(t1.tokens)}
            k = i % len(modes)
            for mode in modes[k:] + modes[:k]:
                row[mode] = (anchor_turn2(anchor, eng, q, a.answer_tokens)
                             if mode == "llama-cpp-python"
                             else turn2(eng, mode, msgs2, snapshot, a.check_tokens))
            rows.append(row)
            cells = "  ".join(f"{m} {row[m]['ttft'] * 1000:.0f} ms "
                              f"[cpu {row[m]['ttft_cpu'] * 1000:.0f}]"
                              + (f" ({row[m]['reused']}/{row[m]['prompt']})" if "reused" in row[m]
                                 else "") for m in modes)
            same = row["exact+refresh"]["tokens"] == row["none"]["tokens"]
            if a.out is not None:  # kept current, so a run cut short still has its figures
                write(a.out, a, rows)
            print(f"q{q['question_id']} {q['category']}: {cells}  refresh "
                  f"{row['exact+refresh']['refresh_seconds'] * 1000:.0f} ms "
                  f"[cpu {row['exact+refresh']['refresh_cpu_seconds'] * 1000:.0f}]  exact+refresh "
                  f"{'=' if same else '!='} none", flush=True)
    finally:
        if anchor is not None:
            anchor.close()
        eng.close()
    print(json.dumps(summary(rows), indent=2))
    if a.out is not None:
        write(a.out, a, rows)


def write(path: Path, args, rows: list[dict]) -> None:
    path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                "summary": summary(rows), "questions": rows}, indent=1))


if __name__ == "__main__":
    main()
