"""The exact-mode KV refresh on real models: after Conversation.settle() the second turn of
real MT-bench conversations reuses the previous answer's KV, and its greedy output equals a
fresh prefill of the whole conversation token for token, as do the logits at the end of its
prompt, bitwise.

Qwen2.5-0.5B Q4_K_M loads with repacked weights, like the default target, whose gemm/gemv
row grouping made decode-written KV differ (docs/conversations.md); SmolLM2 is the fast one.
The answers are drafted by ngram+suffix, so verify passes wrote their KV before the refresh.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgespec.decoding import kvcache
from edgespec.chat.conversation import Conversation
from edgespec.api.events import Finished
from edgespec.decoding.kvcache import ROW_GROUP, common_prefix
from edgespec.runtime.kernel import FA_TILE_ROWS, KernelConfig
from edgespec.api.params import GenerationParams

QUESTIONS = Path(__file__).resolve().parents[2] / "edgespec/lab/bench/data/spec_bench_question.jsonl"


def two_turn(n: int, skip: int = 0) -> list[list[str]]:
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    return [r["turns"] for r in rows if len(r.get("turns", ())) >= 2][skip:skip + n]


@pytest.fixture(scope="module", params=["smollm2-135m", "qwen-0.5b"])
def engine(request, engine_factory):
    return engine_factory(request.param, proposer="ngram+suffix", adaptive=True, exact=True)


# writing, roleplay, reasoning, math, coding: one conversation of each kind
CONVERSATIONS = [two_turn(1, skip)[0] for skip in (0, 10, 20, 30, 40)]


@pytest.mark.parametrize("turns", CONVERSATIONS, ids=lambda t: t[0][:24])
def test_refreshed_turn_two_reuses_the_answer_and_equals_a_fresh_prefill(engine, turns,
                                                                          monkeypatch):
    # refresh passes of 16 positions, so the answers take several (the default is 64)
    monkeypatch.setattr(kvcache, "REFRESH_CHUNK", 16)
    params = GenerationParams(max_tokens=48)
    # twice: the second time turn 1's prompt is mostly reused from the fresh prefill that
    # ended the first round, and its last few tokens are computed by a short pass
    # the engine is shared with other modules: start from nothing they left in RAM
    engine.kv_cache.invalidate()
    engine.kv_cache.ram.clear()
    for _ in range(2):
        conv = Conversation(engine, params=params, exact=True)
        conv.ask(turns[0])
        held = list(engine.kv_cache.held)
        refreshed = conv.settle()
        assert refreshed > 0 and engine.kv_cache.held == held
        assert engine.kv_cache.prefilled == len(held) - len(held) % ROW_GROUP

        prompt2 = engine.prompt_tokens(
            [*conv.history(), {"role": "user", "content": turns[1]}], params)
        fin = [ev for ev in conv.send(turns[1]) if isinstance(ev, Finished)][-1]
        shared = min(common_prefix(held, prompt2), len(prompt2) - kvcache.MIN_PASS)
        assert fin.stats.prompt_reused == shared - shared % ROW_GROUP
        # the template's retokenization keeps the answer whole here: all of it is reused
        assert fin.stats.prompt_reused >= len(held) - ROW_GROUP

        engine.kv_cache.invalidate()
        engine.kv_cache.ram.clear()
        ref = engine.generate(conv.history()[:-1], params, reuse=False, exact=True)
        assert ref.tokens == fin.tokens, "turn 2 differs after the refresh"


def test_refreshed_prefix_gives_the_fresh_prefills_logits_bitwise(engine):
    params = GenerationParams(max_tokens=40)
    turns = CONVERSATIONS[3]
    # the engine is shared with other modules: start from nothing they left in RAM
    engine.kv_cache.invalidate()
    engine.kv_cache.ram.clear()
    for _ in range(2):
        conv = Conversation(engine, params=params, exact=True)
        conv.ask(turns[0])
        conv.settle()
        prompt2 = engine.prompt_tokens(
            [*conv.history(), {"role": "user", "content": turns[1]}], params)
        kv = engine.kv_cache
        reused = kv.prefill(prompt2, reuse=True, prefilled_only=True)
        assert reused.reused > len(prompt2) // 2
        kv.invalidate()
        fresh = kv.prefill(prompt2, reuse=False)
        assert np.array_equal(reused.logits, fresh.logits)


def last_logits(ctx, body: list[int], tail: list[int], split: int, rows: int) -> np.ndarray:
    """The logits at the end of ``tail`` after ``body``, whose positions split..split+rows-1
    were computed by a pass of ``rows`` rows and the rest by long passes."""
    ctx.trim(0, 0)
    ctx.decode(body[:split], 0, 0, logits="none")
    if rows:
        ctx.decode(body[split:split + rows], split, 0, logits="none")
    ctx.decode(body[split + rows:], split + rows, 0, logits="none")
    return ctx.decode(tail, len(body), 0, logits="last")


def test_min_pass_short_passes_take_other_kernels_on_repacked_weights(engine_factory):
    """Why kvcache.MIN_PASS is 8: on Qwen's repacked Q4_K weights the rows of a 4-7 row pass
    differ from the same rows computed in a long prefill; from 8 rows on they agree."""
    eng = engine_factory("qwen-0.5b", proposer="ngram+suffix", adaptive=True, exact=True)
    ctx = eng.ctx
    text = " ".join(t[0] for t in CONVERSATIONS)
    toks = eng.target.tokenize(text)[:136]
    body, tail = toks[:128], toks[128:]

    eng.kv_cache.invalidate()
    try:
        ref = last_logits(ctx, body, tail, 64, 0)
        same = {rows: np.array_equal(last_logits(ctx, body, tail, 64, rows), ref)
                for rows in (4, 7, 8, 12)}
    finally:
        eng.kv_cache.invalidate()
    assert same == {4: False, 7: False, 8: True, 12: True}
    assert kvcache.MIN_PASS == 8


# --- an F16 KV cache with flash attention: the tiled attention kernel ------------------------
@pytest.fixture(scope="module")
def f16(engine_factory):
    return engine_factory("qwen-0.5b", proposer="ngram+suffix", adaptive=True, exact=False,
                          kernel=KernelConfig(kv_type="f16", flash_attn=True))


def test_fa_tile_rows_short_passes_take_the_one_row_attention_over_f16(f16):
    """Why an F16 context's min_pass is 64 (runtime.kernel.FA_TILE_ROWS): ggml-cpu's flash
    attention over an F16 cache takes its tiled kernel from 64 query rows on, and a row
    comes out the same in any such pass; a shorter pass takes the one-row loop."""
    ctx = f16.ctx
    assert ctx.min_pass == FA_TILE_ROWS == 64
    text = " ".join(t[0] for t in CONVERSATIONS) * 2
    toks = f16.target.tokenize(text)[:260]
    assert len(toks) == 260
    body, tail = toks[:256], toks[256:]

    f16.kv_cache.invalidate()
    try:
        ref = last_logits(ctx, body, tail, 64, 0)  # passes of 64 and 192 rows
        same = {rows: np.array_equal(last_logits(ctx, body, tail, 64, rows), ref)
                for rows in (32, 63, 64, 128)}
    finally:
        f16.kv_cache.invalidate()
    assert same == {32: False, 63: False, 64: True, 128: True}


def test_an_f16_warm_prefill_gives_the_cold_prefills_logits_past_a_batch(f16):
    """A prompt of n_batch + 18 tokens: a cold prefill splits it as 464 + 66 rows
    (runtime.kernel.pass_sizes), never into 512 + 18 whose last rows would take the one-row
    attention; after an earlier prompt that shares its first 430 tokens, the same prompt
    reuses what that one's prefill wrote, computes the rest in one pass across the cold
    prefill's boundary, and gives the cold prefill's logits bitwise."""
    kv = f16.kv_cache
    text = " ".join(t[0] + " " + t[1] for t in CONVERSATIONS) * 4
    toks = f16.target.tokenize(text)
    n = f16.ctx.n_batch + 18
    assert len(toks) >= n
    prompt, earlier = toks[:n], toks[:n - 100] + toks[:100]
    try:
        kv.invalidate()
        cold = kv.prefill(prompt, reuse=False)
        kv.invalidate()
        kv.prefill(earlier, reuse=False)
        warm = kv.prefill(prompt, reuse=True, prefilled_only=True)
        assert warm.reused == n - 100 - (n - 100) % ROW_GROUP and warm.computed > 66
        assert np.array_equal(warm.logits, cold.logits)
    finally:
        kv.invalidate()
