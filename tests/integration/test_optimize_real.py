"""`edgespec models optimize` with the real llama-quantize on a real model: qwen-0.5b (a
Q4_K_M whose output and some FFN matrices are Q6_K) re-laid into a temporary EDGESPEC_HOME,
registered, with no Q6_K left, and the copy loads and generates. Skips, saying how to build
it, where `make anchors` has not built llama-quantize."""
from __future__ import annotations

import os

import pytest

from edgespec import paths, registry
from edgespec.registry import optimize
from edgespec.runtime.gguf_header import read_gguf_header

Q6_K, Q8_0 = 14, 8


def test_qwen_0_5b_relaid_loads_and_generates(model_path, tmp_path, monkeypatch):
    tool = paths.anchors_bin_dir() / "llama-quantize"
    if not os.access(tool, os.X_OK):
        pytest.skip(f"llama-quantize is not built ({tool} is missing): `make anchors` builds "
                    "it beside the anchors")
    src = model_path("qwen-0.5b")
    before = read_gguf_header(src).tensors
    assert any(t.ggml_type == Q6_K for t in before)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    made = optimize.optimize(str(src), name="qwen05-q8", quantize=tool, threads=2,
                             progress=lambda m: None)
    assert made.spec == registry.load_registry().get("qwen05-q8")
    info = read_gguf_header(made.spec.path)
    assert not [t for t in info.tensors if t.ggml_type == Q6_K]
    # every Q6_K tensor became Q8_0 (the source has Q8_0 ones of its own: rows not of 256)
    assert len(made.changed) == sum(t.ggml_type == Q6_K for t in before) > 0
    assert sum(t.ggml_type == Q8_0 for t in info.tensors) == \
        sum(t.ggml_type == Q8_0 for t in before) + len(made.changed)
    assert made.size_after > made.size_before
    # the copy loads and generates; Q8_0 holds every Q6_K value almost exactly, so its first
    # greedy token is the source's
    copy, original = _greedy(made.spec.path), _greedy(src)
    assert len(copy) == 6 and copy[0] == original[0], (copy, original)


def _greedy(path, count: int = 6) -> list[int]:
    from edgespec.runtime.model import load_model  # deferred: it loads llama.cpp

    model = load_model(path)
    try:
        ctx = model.new_context(n_ctx=128, n_batch=64, n_threads=2)
        ids = model.tokenize("def fibonacci(n):")
        row = ctx.decode(ids, 0, logits="last")[0]
        out: list[int] = []
        for i in range(count):
            out.append(int(row.argmax()))
            row = ctx.decode([out[-1]], len(ids) + i, logits="last")[0]
        return out
    finally:
        model.close()
