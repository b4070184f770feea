"""Decode on 4 KiB pages against 2 MiB pages, ours beside llama-completion (docs/benchmarks.md).

Each arm runs in a fresh process, interleaved in rotating order over rounds, at a few prompt
lengths, with an F16 KV cache and flash attention (the kernel choice on the Xeon and EPYC):

* ``ours-4k-mmap``: our plain path without the huge-page advice (EDGESPEC_HUGE_PAGES=0);
* ``ours-huge-mmap``: with it, the weights mapped from the file (``--mmap``);
* ``ours-4k-ram`` / ``ours-huge-ram``: the weights read into RAM (``--no-mmap``; unasked,
  the engine reads a repacking CPU load into RAM where huge pages exist);
* ``llama``: llama-completion as shipped (what the bench compares with);
* ``llama-thp``: llama-completion with glibc's hugetlb tunable, its huge pages.

    python tools/hugepages_ab.py ~/.cache/edgespec/models/qwen-1.5b.gguf --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_ab import N_BATCH, N_CTX, interleaved, llama, long_text, ours, report  # noqa: E402

from edgespec.lab.bench.tools import check_built, tool_path  # noqa: E402
from edgespec.runtime.kernel import KV_GGML_TYPE  # noqa: E402
from edgespec.runtime.model import load_model  # noqa: E402

ARMS = ("ours-4k-mmap", "ours-huge-mmap", "ours-4k-ram", "ours-huge-ram", "llama", "llama-thp")


def worker(model: Path, mmap: bool, n_prompt: int, n: int, threads: int) -> None:
    m = load_model(model, use_mmap=mmap)
    f16 = KV_GGML_TYPE["f16"]
    ctx = m.new_context(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=threads, flash_attn=1,
                        type_k=f16, type_v=f16)
    print(json.dumps(ours(ctx, long_text(m)[:n_prompt], n)))


def run_arm(arm: str, a, binary: Path, prompt: bytes, n_prompt: int) -> tuple[float, float]:
    if arm.startswith("llama"):
        env = ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"} if arm == "llama-thp" else {})
        old = dict(os.environ)
        os.environ.update(env)
        try:
            return llama(binary, a.model, prompt, a.tokens, a.threads, [])
        finally:
            os.environ.clear()
            os.environ.update(old)
    env = dict(os.environ, EDGESPEC_HUGE_PAGES="0" if "-4k-" in arm else "1")
    out = subprocess.run([sys.executable, __file__, str(a.model), "--worker",
                          "mmap" if arm.endswith("mmap") else "ram", "--n-prompt", str(n_prompt),
                          "--tokens", str(a.tokens), "--threads", str(a.threads)],
                         env=env, capture_output=True, text=True, check=True).stdout
    pf, dc = json.loads(out.strip().splitlines()[-1])
    return pf, dc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="tokens decoded per run")
    ap.add_argument("--lengths", default="300,1000", help="prompt lengths in tokens")
    ap.add_argument("--worker", choices=("mmap", "ram"), help=argparse.SUPPRESS)
    ap.add_argument("--n-prompt", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.model, a.worker == "mmap", a.n_prompt, a.tokens, a.threads)
        return
    binary = tool_path(check_built(["llama-completion"]), "llama-completion")
    lengths = [int(x) for x in a.lengths.split(",")]
    m = load_model(a.model, use_mmap=True)
    text = long_text(m, max(lengths))
    got = interleaved(list(ARMS), lengths, a.rounds, lambda arm, n: run_arm(
        arm, a, binary, m.detokenize(text[:n]), n))
    report(got, list(ARMS), lengths, "llama")

if __name__ == "__main__":
    main()
