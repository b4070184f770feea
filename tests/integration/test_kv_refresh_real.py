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


def test_min_pass_short_passes_take_other_kernels_on_repacked_weights(engine_factory):
    """Why kvcache.MIN_PASS is 8: on Qwen's repacked Q4_K weights the rows of a 4-7 row pass
    differ from the same rows computed in a long prefill; from 8 rows on they agree."""
    eng = engine_factory("qwen-0.5b", proposer="ngram+suffix", adaptive=True, exact=True)
    ctx = eng.ctx
    text = " ".join(t[0] for t in CONVERSATIONS)
    toks = eng.target.tokenize(text)[:136]
    body, tail = toks[:128], toks[128:]

    def last_logits(split: int, rows: int) -> np.ndarray:
        """Positions split..split+rows-1 by a pass of `rows`, the rest by long passes."""
        ctx.trim(0, 0)
        ctx.decode(body[:split], 0, 0, logits="none")
        if rows:
            ctx.decode(body[split:split + rows], split, 0, logits="none")
        ctx.decode(body[split + rows:], split + rows, 0, logits="none")
        return ctx.decode(tail, 128, 0, logits="last")

    eng.kv_cache.invalidate()
    try:
        ref = last_logits(64, 0)
        same = {rows: np.array_equal(last_logits(64, rows), ref) for rows in (4, 7, 8, 12)}
    finally:
        eng.kv_cache.invalidate()
    assert same == {4: False, 7: False, 8: True, 12: True}
    assert kvcache.MIN_PASS == 8
