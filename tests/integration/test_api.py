"""The Python API a desktop app embeds: stream, cancel, stats, one request at a time."""
from __future__ import annotations

import threading
import time

import pytest

from edgespec import ContextOverflowError, GenerationParams, InvalidInputError, SamplingParams
from edgespec.api.events import Finished, Step

LONG = GenerationParams(max_tokens=400)


def test_cancel_from_another_thread(engine_factory):
    eng = engine_factory("smollm2-135m")
    seen = []

    def consume():
        for ev in eng.stream("Write a long story about a dragon.", LONG, proposer="none"):
            seen.append(ev)

    th = threading.Thread(target=consume)
    th.start()
    while not any(isinstance(e, Step) for e in seen):
        time.sleep(0.01)
    eng.cancel()
    th.join(timeout=30)
    assert not th.is_alive()
    fin = seen[-1]
    assert isinstance(fin, Finished) and fin.stop_reason == "cancelled"
    assert 0 < len(fin.tokens) < 400
    # the engine is usable afterwards
    again = eng.generate("Say hi.", GenerationParams(max_tokens=4), proposer="ngram")
    assert again.stop_reason in ("length", "eos")


def test_concurrent_callers_are_serialised(engine_factory):
    eng = engine_factory("smollm2-135m")
    results = {}

    def run(i):
        results[i] = eng.generate(f"Count from {i} to {i + 5}.", GenerationParams(max_tokens=12),
                                  proposer="ngram")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    solo = {i: eng.generate(f"Count from {i} to {i + 5}.", GenerationParams(max_tokens=12),
                            proposer="ngram") for i in range(3)}
    assert {i: r.tokens for i, r in results.items()} == {i: r.tokens for i, r in solo.items()}


def test_stats_are_filled(engine_factory):
    eng = engine_factory("smollm2-135m")
    r = eng.generate("Repeat: one two three one two three one two three",
                     GenerationParams(max_tokens=30), proposer="ngram")
    s = r.stats
    assert s.generated_tokens == len(r.tokens)
    assert s.prompt_tokens > 0 and s.prefill_seconds > 0 and s.ttft_seconds is not None
    assert s.total_seconds >= s.prefill_seconds
    assert sum(s.accepted_length_hist.values()) == s.verify_passes + s.plain_steps
    d = s.to_dict()
    for key in ("acceptance_rate", "mean_accepted_length", "position_acceptance", "proposer_share",
                "itl_p50", "decode_tokens_per_second", "draft_seconds", "verify_seconds"):
        assert key in d


def test_seeded_sampling_is_reproducible(engine_factory):
    eng = engine_factory("smollm2-135m")
    p = GenerationParams(max_tokens=16, sampling=SamplingParams(temperature=0.9, seed=7))
    for proposer in ("none", "ngram"):
        a = eng.generate("Tell me a fun fact.", p, proposer=proposer)
        b = eng.generate("Tell me a fun fact.", p, proposer=proposer)
        assert a.tokens == b.tokens, proposer


def test_bad_requests_fail_before_any_work(engine_factory):
    eng = engine_factory("smollm2-135m")
    with pytest.raises(InvalidInputError):
        eng.generate("   ", GenerationParams(max_tokens=4))
    with pytest.raises(InvalidInputError):
        eng.generate("ok", GenerationParams(max_tokens=0))
    with pytest.raises(InvalidInputError):
        eng.generate("bad \udcff surrogate", GenerationParams(max_tokens=4))
    with pytest.raises(InvalidInputError):
        eng.generate("ok", GenerationParams(max_tokens=4), proposer="draft")  # not loaded
    with pytest.raises(ContextOverflowError):
        eng.generate("word " * 3000, GenerationParams(max_tokens=4))


def test_generation_stops_cleanly_when_the_context_fills(model_path):
    from edgespec.engine.engine import Engine
    eng = Engine.load(str(model_path("smollm2-135m")), proposer="ngram", n_ctx=64, threads=2)
    try:
        r = eng.generate("Count upwards from one, forever.", GenerationParams(max_tokens=500))
        assert r.stop_reason in ("context", "eos")
        # every evaluated token holds a KV slot; the last emitted one was never evaluated
        assert r.stats.prompt_tokens + len(r.tokens) - 1 <= 64
        if r.stop_reason == "context":
            assert r.stats.prompt_tokens + len(r.tokens) - 1 == 64
    finally:
        eng.close()


def test_multi_turn_messages(engine_factory):
    eng = engine_factory("smollm2-135m")
    msgs = [{"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": "Nice to meet you, Ada."},
            {"role": "user", "content": "What is my name?"}]
    r = eng.generate(msgs, GenerationParams(max_tokens=12), proposer="none")
    last = eng.generate(msgs[-1:], GenerationParams(max_tokens=12), proposer="none")
    assert r.tokens and r.text
    # the whole history went through the template: the earlier turns' tokens are in the prompt
    earlier = sum(len(eng.target.tokenize(m["content"], add_special=False, parse_special=False))
                  for m in msgs[:2])
    assert r.stats.prompt_tokens >= last.stats.prompt_tokens + earlier
