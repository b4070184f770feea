"""Serving benchmark: edgespec serve against llama-server, same model, same prompts, loopback.

    .venv/bin/python tools/bench_serve.py --target qwen-1.5b --concurrency 1,2,4,8 \
        --categories summarization,rag,humanevalfix,writing --per-category 2 --out docs/bench/serve

Configurations (each a real server process started here, one at a time; the order
alternates between rounds so drift does not favour one side):

    edgespec        edgespec serve (the default: lossless speculation, adaptive, batched)
    edgespec-plain  edgespec serve --proposer none (its own plain batched throughput)
    edgespec-exact  edgespec serve --exact (each pass within the probed invariant rows)
    llama-server    llama.cpp's server built by `make anchors` from the same llama.cpp
    llama-lookup    llama-server with its n-gram speculation (--spec-type ngram-cache)

At each concurrency c, c clients send the prompts (greedy, stream, max_tokens) until every
prompt was served once; reported per (configuration, c): aggregate completion tokens/s,
TTFT p50/p95 and inter-token latency p50/p95 (per request: (last - first token) / (n - 1)).
Ratios are against edgespec-plain at the same concurrency, from the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgespec import registry  # noqa: E402
from edgespec.lab.bench.anchors.paths import anchors_bin_dir  # noqa: E402
from edgespec.lab.bench.prompts import HUMANEVALFIX, load_humanevalfix, load_spec_bench  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cmd(kind: str, model: Path, port: int, parallel: int, ctx: int, threads: int,
               edgespec_bin: str, llama_server: Path) -> list[str]:
    if kind.startswith("edgespec"):
        cmd = [edgespec_bin, "serve", "--target", str(model), "--port", str(port),
               "--parallel", str(parallel), "--ctx", str(ctx), "--threads", str(threads),
               "--log-level", "warning", "--max-queue", "64"]
        if kind == "edgespec-plain":
            cmd += ["--proposer", "none"]
        elif kind == "edgespec-exact":  # what the bitwise promise costs under concurrency
            cmd += ["--exact"]
        return cmd
    # the kernels edgespec runs: flash attention with a Q8_0 KV cache, repacked weights,
    # one unified cell pool of parallel x ctx
    cmd = [str(llama_server), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
           "-np", str(parallel), "-c", str(ctx * parallel), "-kvu", "-t", str(threads),
           "-tb", str(threads), "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0",
           "--no-webui", "-lv", "1"]
    if kind == "llama-lookup":
        cmd += ["--spec-type", "ngram-cache"]
    return cmd


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become ready")


async def one(client: openai.AsyncOpenAI, model: str, messages: list[dict], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    times: list[float] = []
    usage = None
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True})
    async for ev in stream:
        if ev.usage:
            usage = ev.usage
        for ch in ev.choices or []:
            if ch.delta and ch.delta.content:
                times.append(time.perf_counter() - t0)
    n = int(usage.completion_tokens) if usage else len(times)
    ttft = times[0] if times else float("nan")
    itl = (times[-1] - times[0]) / (n - 1) if len(times) > 1 and n > 1 else float("nan")
    return {"tokens": n, "ttft": ttft, "itl": itl, "seconds": time.perf_counter() - t0}


async def level(port: int, prompts: list[list[dict]], c: int, max_tokens: int) -> dict:
    queue = list(prompts)
    out: list[dict] = []
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                timeout=600.0, max_retries=3)  # llama-server drops idle keep-alives

    model = (await client.models.list()).data[0].id

    async def worker() -> None:
        while queue:
            msgs = queue.pop(0)
            # a tag of its own at the start of every prompt: both servers keep earlier
            # prompts' KV, and a level must not reuse the one before it
            tag = f"[{c}:{len(queue)}:{time.monotonic_ns() % 100000}] "
            msgs = [{**msgs[0], "content": tag + msgs[0]["content"]}, *msgs[1:]]
            out.append(await one(client, model, msgs, max_tokens))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(c)))
    wall = time.perf_counter() - t0
    await client.close()

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(x for x in xs if x == x)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    ttft = [r["ttft"] for r in out]
    itl = [r["itl"] for r in out]
    tokens = sum(r["tokens"] for r in out)
    return {"concurrency": c, "requests": len(out), "tokens": tokens, "wall": wall,
            "tok_s": tokens / wall, "ttft_p50": pct(ttft, 0.5), "ttft_p95": pct(ttft, 0.95),
            "itl_p50": pct(itl, 0.5), "itl_p95": pct(itl, 0.95)}


def load_prompts(categories: list[str], per: int) -> list[tuple[str, list[dict]]]:
    out = []
    spec = [c for c in categories if c != HUMANEVALFIX]
    if spec:
        for p in load_spec_bench(categories=spec, per_category=per, max_turns=1):
            out.append((p.category, p.messages([])))
    if HUMANEVALFIX in categories:
        for p in load_humanevalfix(n=per):
            out.append((p.category, p.messages([])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen-1.5b")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--categories", default="summarization,rag,humanevalfix,writing")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="edgespec,edgespec-plain,llama-server,llama-lookup")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("docs/bench/serve"))
    args = ap.parse_args()

    levels = [int(x) for x in args.concurrency.split(",")]
    model = registry.resolve(args.target, pull=False)
    llama_server = anchors_bin_dir() / "llama-server"
    configs = args.configs.split(",")
    if any(k.startswith("llama") for k in configs) and not os.access(llama_server, os.X_OK):
        print(f"error: {llama_server} is missing: run `make anchors`", file=sys.stderr)
        return 2
    edgespec_bin = str(Path(sys.executable).with_name("edgespec"))
    prompts = load_prompts(args.categories.split(","), args.per_category)
    msgs = [m for _, m in prompts]
    results: list[dict] = []
    for rnd in range(args.rounds):
        order = configs if rnd % 2 == 0 else configs[::-1]
        for kind in order:
            port = free_port()
            cmd = server_cmd(kind, model, port, max(levels), args.ctx, args.threads,
                             edgespec_bin, llama_server)
            print(f"[round {rnd + 1}] {kind}: {' '.join(cmd)}", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            log = open(args.out / f"{kind}.server.log", "wb")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                wait_ready(port, proc)
                asyncio.run(level(port, msgs[:1], 1, 8))  # warm-up: first-use costs
                for c in levels:
                    r = asyncio.run(level(port, msgs, c, args.max_tokens))
                    r.update(config=kind, round=rnd + 1)
                    results.append(r)
                    print(f"  c={c}: {r['tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50']:.2f}s "
                          f"p95 {r['ttft_p95']:.2f}s, ITL p50 {r['itl_p50'] * 1e3:.0f}ms "
                          f"p95 {r['itl_p95'] * 1e3:.0f}ms", flush=True)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                log.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()},
         "prompts": [c for c, _ in prompts], "results": results}, indent=1) + "\n")
    # the table: mean over rounds, ratio to edgespec-plain at the same concurrency
    lines = ["| configuration | c | tok/s | vs edgespec plain | TTFT p50 / p95 (s) | ITL p50 / p95 (ms) |",
             "|---|---|---|---|---|---|"]
    for kind in configs:
        for c in levels:
            rs = [r for r in results if r["config"] == kind and r["concurrency"] == c]
            base = [r for r in results if r["config"] == "edgespec-plain" and r["concurrency"] == c]
            if not rs:
                continue
            tps = statistics.fmean(r["tok_s"] for r in rs)
            ratio = (f"{tps / statistics.fmean(r['tok_s'] for r in base):.2f}×" if base else "–")
            lines.append(f"| {kind} | {c} | {tps:.1f} | {ratio} | "
                         f"{statistics.fmean(r['ttft_p50'] for r in rs):.2f} / "
                         f"{statistics.fmean(r['ttft_p95'] for r in rs):.2f} | "
                         f"{statistics.fmean(r['itl_p50'] for r in rs) * 1e3:.0f} / "
                         f"{statistics.fmean(r['itl_p95'] for r in rs) * 1e3:.0f} |")
    table = "\n".join(lines)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
