"""Greedy speculative output must equal the plain path token for token, on real models.

Small models keep this fast: SmolLM2-135M (other tokenizer) for the free proposers,
Qwen 0.5B as its own draft (shares the vocabulary trivially) for the draft path.
"""
from __future__ import annotations

import pytest

from edgespec import GenerationParams
from edgespec.api.events import Finished, PrefillDone, RequestStarted, Step

PROMPTS = [
    "List the first ten prime numbers, separated by commas.",
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Rewrite this code with better names:\n\ndef f(a, b):\n    c = a + b\n    d = c * 2\n    return d\n\n"
    "def g(a, b):\n    c = a - b\n    d = c * 2\n    return d\n",
]


def _run(engine, prompt, proposer, **kw):
    kw.setdefault("max_tokens", 48)
    return engine.generate(prompt, GenerationParams(**kw), proposer=proposer)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_free_proposers_match_plain_greedy(engine_factory, prompt, proposer):
    eng = engine_factory("smollm2-135m")
    plain = _run(eng, prompt, "none")
    spec = _run(eng, prompt, proposer)
    assert spec.tokens == plain.tokens
    assert spec.text == plain.text
    assert spec.stop_reason == plain.stop_reason


def test_speculation_actually_happens_on_repetitive_prompt(engine_factory):
    eng = engine_factory("smollm2-135m")
    res = _run(eng, PROMPTS[2], "ngram", max_tokens=64)
    assert res.stats.drafted > 0
    assert res.stats.accepted > 0


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_draft_model_matches_plain_greedy(engine_factory, prompt):
    eng = engine_factory("qwen-0.5b", draft="qwen-0.5b")
    plain = _run(eng, prompt, "none", max_tokens=24)
    spec = _run(eng, prompt, "draft", max_tokens=24)
    assert spec.tokens == plain.tokens
    # a model drafting for itself agrees nearly always
    assert spec.stats.acceptance_rate > 0.8


def test_qwen_pair_matches_plain_greedy(engine_factory):
    eng = engine_factory("qwen-1.5b", draft="qwen-0.5b")
    prompt = PROMPTS[2]
    plain = _run(eng, prompt, "none", max_tokens=20)
    for proposer in ("draft", "ngram"):
        spec = _run(eng, prompt, proposer, max_tokens=20)
        assert spec.tokens == plain.tokens, proposer


def test_max_tokens_is_never_overshot(engine_factory):
    eng = engine_factory("smollm2-135m")
    for n in (1, 2, 5, 13):
        res = _run(eng, "Write a long story about a dragon who loves to repeat himself.", "ngram",
                   max_tokens=n)
        assert len(res.tokens) == n and res.stop_reason == "length"


def test_stop_string_inside_accepted_draft(engine_factory):
    eng = engine_factory("smollm2-135m")
    plain = _run(eng, PROMPTS[1], "none", max_tokens=64)
    # pick a stop string from the middle of the plain answer, after drafts have started
    words = plain.text.split()
    stop = " ".join(words[len(words) // 2: len(words) // 2 + 2])
    for proposer in ("none", "ngram", "suffix"):
        res = _run(eng, PROMPTS[1], proposer, max_tokens=64, stop=(stop,))
        assert res.stop_reason == "stop", proposer
        assert stop not in res.text
        assert plain.text.startswith(res.text)
        assert res.text == plain.text[: plain.text.index(stop)]


def test_eos_inside_accepted_draft(engine_factory):
    """The plain answer ends with EOS; speculation must end at the same token."""
    eng = engine_factory("smollm2-135m")
    prompt = "Say only the word: yes"
    plain = _run(eng, prompt, "none", max_tokens=40)
    assert plain.stop_reason == "eos"
    for proposer in ("ngram", "suffix"):
        res = _run(eng, prompt, proposer, max_tokens=40)
        assert res.tokens == plain.tokens and res.stop_reason == "eos"


def test_stream_event_order_and_origins(engine_factory):
    eng = engine_factory("smollm2-135m")
    events = list(eng.stream(PROMPTS[2], GenerationParams(max_tokens=40), proposer="ngram"))
    assert isinstance(events[0], RequestStarted)
    assert isinstance(events[1], PrefillDone)
    assert isinstance(events[-1], Finished)
    steps = [e for e in events if isinstance(e, Step)]
    assert "".join(s.text for s in steps) == events[-1].text
    toks = [t for s in steps for t in s.tokens]
    assert tuple(toks) == events[-1].tokens
    for s in steps:
        assert len(s.origins) == len(s.tokens) == len(s.pieces)
        assert s.origins.count("draft") <= s.accepted
        assert all(o in ("draft", "target") for o in s.origins)
    assert any("draft" in s.origins for s in steps)
