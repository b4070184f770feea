"""After a rejection, the trimmed KV cache must behave as if the rejected tokens never existed."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.runtime.model import load_model


@pytest.fixture(scope="module")
def model(model_path):
    m = load_model(model_path("smollm2-135m"))
    yield m
    m.close()


def _after_rejection(model, prompt, t, junk, y):
    ctx = model.new_context(n_ctx=512, n_threads=2)
    try:
        ctx.decode(prompt, 0)
        ctx.decode([t, *junk], len(prompt), logits="all")
        ctx.trim(0, len(prompt) + 1)  # keep t, drop the rejected drafts
        return ctx.decode([y], len(prompt) + 1)[0]
    finally:
        ctx.close()


def test_rejected_tokens_leave_no_trace(model):
    prompt = model.tokenize("The capital of France is Paris. The capital of Spain is")
    t, y = model.tokenize(" Madrid", add_special=False)[0], model.tokenize(".", add_special=False)[0]
    a = _after_rejection(model, prompt, t, [11, 22, 33], y)
    b = _after_rejection(model, prompt, t, [4444, 5555, 6666], y)
    # same batch shapes, different rejected content: bitwise identical when trimming is right
    assert np.array_equal(a, b)


def test_trimmed_logits_match_a_fresh_evaluation(model):
    prompt = model.tokenize("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return")
    t, y = model.tokenize(" a", add_special=False)[0], model.tokenize(" -", add_special=False)[0]
    trimmed = _after_rejection(model, prompt, t, [100, 200, 300, 400], y)
    ctx = model.new_context(n_ctx=512, n_threads=2)
    try:
        ctx.decode(prompt, 0)
        ctx.decode([t], len(prompt))
        fresh = ctx.decode([y], len(prompt) + 1)[0]
    finally:
        ctx.close()
    # t's K/V were computed inside a 5-token batch in one run and alone in the other;
    # llama.cpp's CPU kernels are not batch-invariant in general (Qwen Q4_K_M drifts by up
    # to ~0.5 at k>=8, see docs/parity.md); for SmolLM2 Q4_1 at this size the measured
    # difference is 0.0. A stale KV entry shows as O(1), so 0.05 still catches bad trims.
    diff = float(np.max(np.abs(trimmed - fresh)))
    assert diff < 0.05, diff
    assert int(np.argmax(trimmed)) == int(np.argmax(fresh))
