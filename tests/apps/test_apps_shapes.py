"""The llama-cpp-python-shaped layer on the fake backend (no llama.cpp, no model): how the
engine's events become dicts and chunks, and which arguments are refused before anything
runs. The fake model's greedy text after "a" is "bcéd abcéd ..." ("é" is two tokens)."""
from __future__ import annotations

import pytest

from edgespec.apps import completions, shapes
from edgespec.errors import InvalidInputError
from fakes import FakeModel, fake_engine


@pytest.fixture
def engine():
    return fake_engine(FakeModel(), {})


def test_completion_dict(engine):
    out = completions.create_completion(engine, "a", max_tokens=6, temperature=0)
    assert out["id"].startswith("cmpl-") and len(out["id"]) == len("cmpl-") + 36
    assert out["object"] == "text_completion" and out["model"] == engine.target_name
    assert out["choices"] == [{"text": "bcéd ", "index": 0, "logprobs": None,
                               "finish_reason": "length"}]
    assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}
    echo = completions.create_completion(engine, "a", max_tokens=2, temperature=0, echo=True,
                                         model="mine")
    assert echo["choices"][0]["text"] == "abc" and echo["model"] == "mine"


def test_completion_chunks_follow_visible_text(engine):
    """One chunk per piece of text: the token that only starts "é" sends nothing, the one
    completing it sends "é" with both tokens' logprobs."""
    chunks = list(completions.create_completion(engine, "a", max_tokens=6, temperature=0,
                                                stream=True, logprobs=1))
    texts = [c["choices"][0]["text"] for c in chunks]
    assert texts == ["b", "c", "é", "d", " ", ""]
    assert len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0] == {"text": "", "index": 0, "logprobs": None,
                                        "finish_reason": "length"}
    lp = chunks[2]["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 2 and lp["text_offset"] == [3, 3]  # "a" + "bc" before it
    assert chunks[0]["choices"][0]["logprobs"]["text_offset"] == [1]


def test_stop_string_held_back_then_cut(engine):
    out = list(completions.create_completion(engine, "a", max_tokens=12, temperature=0,
                                             stop=["d a"], stream=True))
    assert "".join(c["choices"][0]["text"] for c in out) == "bcé"
    assert out[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_dict_and_chunks():
    # a template that writes the message alone: after "x" the fake model says "yz." and ends
    engine = fake_engine(FakeModel(chat_template="{% for m in messages %}{{ m['content'] }}"
                                                 "{% endfor %}"), {})
    msgs = [{"role": "user", "content": [{"type": "text", "text": "x"}]}]
    whole = completions.create_chat_completion(engine, msgs, temperature=0)
    assert whole["id"].startswith("chatcmpl-")
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "yz."}
    assert whole["choices"][0]["finish_reason"] == "stop"  # end of generation
    chunks = list(completions.create_chat_completion(engine, msgs, temperature=0,
                                                     stream=True))
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant"}, {"content": "y"}, {"content": "z"}, {"content": "."}, {}]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 5
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_unlimited_max_tokens_fills_the_context(engine):
    out = completions.create_completion(engine, "a", max_tokens=None, temperature=0)
    assert out["choices"][0]["finish_reason"] == "length"
    # until the context is full (the last token needs no KV cell of its own)
    assert out["usage"]["total_tokens"] >= engine.ctx.n_ctx


def test_closing_a_stream_frees_the_engine(engine):
    chunks = completions.create_completion(engine, "a", max_tokens=50, stream=True)
    next(chunks)
    assert engine._lock.locked()
    chunks.close()
    assert not engine._lock.locked()


@pytest.mark.parametrize("kwargs, error, named", [
    (dict(prompt=[1, True]), InvalidInputError, "non-empty list of token ids"),
    (dict(prompt=[]), InvalidInputError, "non-empty list of token ids"),
    (dict(prompt=[10 ** 9]), InvalidInputError, "outside this model's vocabulary"),
    (dict(stop=[""]), InvalidInputError, "stop strings must be non-empty"),
    (dict(logit_bias={"x": 1.0}), InvalidInputError, "logit_bias key 'x'"),
    (dict(logit_bias={3: float("nan")}), InvalidInputError, "finite number or -inf"),
    (dict(grammar=42), InvalidInputError, "GBNF text or a llama_cpp.LlamaGrammar"),
    (dict(logprobs=-1), InvalidInputError, "logprobs is the number"),
    (dict(temperature=-1.0), InvalidInputError, "temperature must be >= 0"),
])
def test_completion_refusals(engine, kwargs, error, named):
    kwargs = {"prompt": "a", **kwargs}
    with pytest.raises(error, match=named):
        completions.create_completion(engine, **kwargs)


def test_seeds(engine):
    pinned = completions.Defaults(seed=5)
    call = completions.completion_call(engine, "a", defaults=pinned)
    assert call.params.sampling.seed == 5  # the instance's seed
    assert completions.completion_call(engine, "a", seed=9, defaults=pinned
                                       ).params.sampling.seed == 9
    assert completions.completion_call(engine, "a", seed=-1, defaults=pinned
                                       ).params.sampling.seed is None  # random
    # sampled with the same seed: the same text
    a = completions.create_completion(engine, "a", max_tokens=8, seed=3)
    b = completions.create_completion(engine, "a", max_tokens=8, seed=3)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_response_formats():
    rf = completions._response_format
    assert rf(None) == {} and rf({"type": "text"}) == {}
    assert rf({"type": "json_object"}) == {"json_mode": True}
    schema = {"type": "object"}
    assert rf({"type": "json_object", "schema": schema}) == {"json_schema": schema}
    assert rf({"type": "json_schema", "json_schema": {"schema": schema}}) == {"json_schema": schema}
    with pytest.raises(InvalidInputError, match="json_schema.schema"):
        rf({"type": "json_schema", "json_schema": {"name": "x"}})


def test_chat_logprobs_shape():
    lp = {"tokens": ["a"], "text_offset": [0], "token_logprobs": [-0.5],
          "top_logprobs": [{"a": -0.5, "b": -1.0}]}
    assert shapes.chat_logprobs(lp) == {"content": [{
        "token": "a", "bytes": None, "logprob": -0.5,
        "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": None},
                         {"token": "b", "logprob": -1.0, "bytes": None}]}], "refusal": None}
    assert shapes.chat_logprobs(None) is None
