"""Weights on transparent huge pages (edgespec.runtime.hugepages), on a real model.

Each arm runs in a fresh process, because what a load maps depends on what was mapped
before: the model's weights land on 2 MiB pages with the advice and not without, and the
greedy tokens are the same either way (pages move memory, not arithmetic).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgespec.planner.repack import split_weights
from edgespec.runtime import device
from edgespec.runtime.gguf_facts import read_facts
from edgespec.runtime.hugepages import thp_mode

PROBE = r"""
import json, sys
import numpy as np
from edgespec.runtime.model import load_model
def huge():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) << 10
before = huge()
m = load_model(sys.argv[1], use_mmap=sys.argv[2] == "mmap")
after = huge()
ctx = m.new_context(512, n_batch=64, n_threads=2, flash_attn=1, type_k=1, type_v=1)
toks = m.tokenize("def fibonacci(n):\n    ", add_special=False)
out = [int(np.argmax(ctx.decode(toks, 0)[0]))]
for i in range(7):
    out.append(int(np.argmax(ctx.decode([out[-1]], len(toks) + i)[0])))
print(json.dumps({"huge": after - before, "size": m.size_bytes, "tokens": out}))
"""


def probe(path, mmap: bool, on: bool) -> dict:
    env = dict(os.environ, EDGESPEC_HUGE_PAGES="1" if on else "0")
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), "mmap" if mmap else "ram"],
                         env=env, capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(thp_mode() not in ("madvise", "always"),
                    reason="this kernel gives no transparent huge pages")
@pytest.mark.parametrize("mmap", [False, True], ids=["read-into-ram", "mmap"])
def test_weights_land_on_huge_pages_and_tokens_do_not_change(model_path, mmap):
    path = model_path("qwen-0.5b")
    on, off = probe(path, mmap, True), probe(path, mmap, False)
    assert on["tokens"] == off["tokens"]
    if thp_mode() == "madvise":  # with "always" the kernel does it unasked
        assert off["huge"] < on["size"] // 20
    # read into RAM every weight is anonymous; mapped, only the repacked copies are
    _, anon, copies = split_weights(read_facts(path), device.probe(with_accelerators=False).isa, True, mmap,
                                    gpu_start=10 ** 6)
    assert on["huge"] - off["huge"] >= 0.9 * (anon + copies) - (8 << 20)
