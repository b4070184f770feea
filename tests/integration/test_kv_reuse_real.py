"""Prefix reuse on a real model: with exact=True, greedy output with reuse equals a fresh prefill
token for token on multi-turn conversations, although the KV of earlier answers was written by
decode and verify passes, not by a prefill (docs/parity.md: test it, do not assume it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.chat.conversation import Conversation
from edgespec.api.events import Step
from edgespec.api.params import GenerationParams

QUESTIONS = Path(__file__).resolve().parents[2] / "edgespec/lab/bench/data/spec_bench_question.jsonl"


def two_turn(n: int) -> list[list[str]]:
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    return [r["turns"] for r in rows if len(r.get("turns", ())) >= 2][:n]


@pytest.fixture(scope="module")
def engine(engine_factory):
    # the suffix proposer drafts in every turn, so verify passes write the answers' KV
    return engine_factory("smollm2-135m", proposer="ngram+suffix", adaptive=True)


@pytest.fixture(scope="module")
def exact_engine(engine_factory):
    """Exact mode runs its own batch-invariant kernel configuration."""
    return engine_factory("smollm2-135m", proposer="ngram+suffix", adaptive=True, exact=True)


def fresh(engine, messages, params):
    engine.kv_cache.invalidate()
    return engine.generate(messages, params, reuse=False)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("turns", two_turn(3))
def test_greedy_turns_with_reuse_equal_fresh_prefills(engine, exact_engine, turns, exact):
    """A greedy turn, exact or not, reuses only KV a prefill wrote (edgespec.decoding.kvcache):
    the previous prompt. Not exact, the conversation settles before turn 3 (the answer
    prefilled again while it is read), so turn 3 reuses the answers too. Either way each
    turn is the fresh prefill's output."""
    engine = exact_engine if exact else engine
    params = GenerationParams(max_tokens=48)
    conv = Conversation(engine, params=params, exact=exact)
    t1 = conv.ask(turns[0])
    t2 = conv.ask(turns[1])
    if not exact:
        assert conv.settle() > 0
    t3 = conv.ask("Now summarise all of that in one sentence.")
    # the previous prompt, cut to whole row groups (kvcache.ROW_GROUP)
    assert t2.stats.prompt_reused >= t1.stats.prompt_tokens - 4
    assert t3.stats.prompt_reused >= t2.stats.prompt_tokens - 4
    if not exact:  # settled: the answer's positions as well
        assert t3.stats.prompt_reused > t3.stats.prompt_computed
    for k, t in ((2, t2), (3, t3)):
        engine.kv_cache.invalidate()
        ref = engine.generate(conv.history()[: 2 * k - 1], params, reuse=False, exact=exact)
        assert ref.text == t.text, f"turn {k} differs with reuse"


def test_a_cancelled_turn_then_the_next_turn_equals_a_fresh_prefill(engine):
    params = GenerationParams(max_tokens=40)
    conv = Conversation(engine, params=params)
    n = 0
    for ev in conv.send("Write a short poem about the sea."):
        if isinstance(ev, Step) and ev.tokens:
            n += 1
            if n == 5:
                engine.cancel()
    assert conv.turns[-1].stop_reason == "cancelled"
    t = conv.ask("Now one about the mountains.")
    ref = fresh(engine, conv.history()[:-1], params)
    assert t.stats.prompt_reused > 0 and ref.text == t.text


def test_switching_conversations_restores_from_ram_and_stays_exact(engine):
    params = GenerationParams(max_tokens=32)
    a, b = Conversation(engine, params=params), Conversation(engine, params=params)
    a.ask("Name three rivers in Europe.")
    b.ask("What is 12 times 12?")
    before = engine.kv_cache.ram.hits
    t = a.ask("Which is the longest?")
    assert engine.kv_cache.ram.hits > before and t.stats.prompt_reused > 30
    ref = fresh(engine, a.history()[:-1], params)
    assert ref.text == t.text
    assert engine.kv_cache.ram.nbytes <= engine.kv_cache.ram.budget_bytes
