"""The protocol core without a model: the reader and the OpenAI renderer on literal events,
the limits, the FIM builder on a literal vocabulary, the errors; then the core over the fake
backend's engine (n choices, the default model, a model alias)."""
from __future__ import annotations

import asyncio
import json

import pytest
from fakes import FakeModel
from fakes.engine import fake_engine
from starlette.testclient import TestClient

from edgespec.api.events import Finished, Step, TokenLogprob
from edgespec.api.params import GenerationParams
from edgespec.api.stats import RequestStats
from edgespec.protocol import (ChoiceDone, Core, CoreRequest, Fim, ProtocolError, TextDelta,
                               ToolCallDelta, run, timings)
from edgespec.protocol import limits
from edgespec.protocol.fim import fim_prompt, fim_tokens
from edgespec.protocol.reader import ChoiceReader
from edgespec.server import ServerSettings, create_app
from edgespec.server.errors import APIError, body
from edgespec.server.responses import Shape
from edgespec.serving import ModelPool, Scheduler

MSG = ({"role": "user", "content": "a b c"},)


def step(text, origins=("target",), proposer=None, drafted=0, pieces=None, lps=()):
    toks = tuple(range(3, 3 + len(origins)))
    return Step(1, toks, text, origins, proposer, drafted, sum(o == "draft" for o in origins),
                0.0, 0.0, 0.01, lps, pieces if pieces is not None else (text,) + ("",) * (len(origins) - 1))


def fin(text, tokens=(3, 4), reason="eos", **stats):
    s = RequestStats(prompt_tokens=5, generated_tokens=len(tokens), stop_reason=reason, **stats)
    return Finished(1, text, tuple(tokens), reason, s)


# --- reader ----------------------------------------------------------------------------------
def test_reader_text_origins_and_the_held_back_tail():
    r = ChoiceReader(0, origins=True)
    evs = r.step(step("ab", ("draft", "draft", "target"), "ngram", 3, ("a", "b", "")))
    assert [(t.text, t.origin, t.drafted, t.accepted_at, t.position) for t in evs[0].tokens] == \
        [("a", "ngram", 3, 0, 0), ("b", "ngram", 3, 1, 1), ("", "target", 3, None, 2)]
    out = r.finish(fin("ab:", (3, 4, 5), reason="length", prefill_seconds=0.5,
                       total_seconds=1.5, drafted=3, accepted=2, prompt_reused=1))
    assert out[0] == TextDelta(0, ":")  # released by the assembler at the end
    done = out[-1]
    assert isinstance(done, ChoiceDone) and done.finish == "length" and done.text == "ab:"
    assert (done.prompt_tokens, done.completion_tokens, done.prompt_cached) == (5, 3, 1)
    t = done.timings
    assert (t["prompt_n"], t["cache_n"], t["predicted_n"], t["draft_n"], t["draft_n_accepted"]) \
        == (4, 1, 3, 3, 2)
    assert t["prompt_ms"] == 500.0 and t["predicted_ms"] == 1000.0
    assert t["predicted_per_second"] == 3.0 and t["prompt_per_token_ms"] == 125.0


def test_reader_without_origins_and_echo_prefix():
    r = ChoiceReader(2, prefix="Q: ")
    assert r.start() == [TextDelta(2, "Q: ")]
    assert r.step(step("x")) == [TextDelta(2, "x")]
    done = r.finish(fin("x", (3,), reason="cancelled"))[-1]
    assert done.text == "Q: x" and done.finish == "cancelled" and done.index == 2


class _Turn:
    """A turn output that holds everything until the end, then one call (edgespec.agents'
    stream-delta shapes)."""

    content, reasoning_content, tool_calls = "", "", []

    def feed(self, text):
        return []

    def finish(self, stop_reason):
        from edgespec.agents.calls import ToolCall
        from edgespec.agents.turn import Final
        self.tool_calls = [ToolCall(0, "call_1", "f", '{"a": 1}')]
        return Final([{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                       "function": {"name": "f", "arguments": ""}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}],
                     "tool_calls")


def test_reader_keeps_logprobs_the_turn_holds_back_and_reads_calls():
    r = ChoiceReader(0, _Turn())
    lp = (TokenLogprob(3, -0.5),)
    assert r.step(step("<tool", lps=lp)) == [TextDelta(0, "", (), lp)]
    out = r.finish(fin("<tool", (3,)))
    assert out[:2] == [ToolCallDelta(0, 0, "call_1", "f", ""),
                       ToolCallDelta(0, 0, None, None, '{"a": 1}')]
    assert out[-1].finish == "tool_calls" and out[-1].tool_calls[0].name == "f"


# --- the OpenAI renderer ---------------------------------------------------------------------
def shape(kind="chat", **kw):
    return Shape(kind, "m", "fp", lambda t: b"t%d" % t, identity="id", **kw)


def test_openai_chunks_and_whole_body_from_literal_events():
    r = ChoiceReader(0, origins=True)
    events = r.step(step("hi", ("draft", "target"), "suffix", 1, ("h", "i"))) + \
        r.finish(fin("hi", (3, 4), total_seconds=0.2))
    s = shape(include_usage=True)
    chunks = [c for ev in events for c in s.event(ev)]
    assert chunks[0]["choices"][0]["delta"] == {"content": "hi"}
    assert chunks[0]["edgespec"]["tokens"] == [
        {"text": "h", "origin": "suffix", "drafted": 1, "position": 0},
        {"text": "i", "origin": "target", "drafted": 1, "position": 1}]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop" and last["usage"] is None
    assert last["timings"]["predicted_n"] == 2 and "proposer" in last["edgespec"]
    whole = shape().whole([r.done])
    assert whole["choices"][0]["message"]["content"] == "hi"
    assert whole["timings"] == r.done.timings and whole["usage"]["total_tokens"] == 7


def test_completions_usage_counts_each_prompt_once_and_every_choice():
    dones = []
    for i, (req, text) in enumerate([(0, "a"), (0, "b"), (1, "c")]):
        rd = ChoiceReader(i, request=req)
        dones.append(rd.finish(fin(text, (3,)))[-1])
    w = shape("completion").whole(dones)
    assert [c["index"] for c in w["choices"]] == [0, 1, 2]
    assert w["usage"]["prompt_tokens"] == 10 and w["usage"]["completion_tokens"] == 3
    assert len(w["edgespec"]["choices"]) == 3


def test_completions_logprob_offsets_start_after_the_echo():
    rd = ChoiceReader(0, prefix="ab")
    d = rd.finish(Finished(1, "x", (3,), "eos", RequestStats(prompt_tokens=1),
                           (TokenLogprob(3, -1.0),)))[-1]
    lp = shape("completion").whole([d], {0: "ab"})["choices"][0]["logprobs"]
    assert lp["text_offset"] == [2] and lp["tokens"] == ["t3"]


# --- limits, errors, FIM ------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["+5", "٣", "5 ", "", "1" * 13, "-1", "99"])
def test_logit_bias_keys_are_ascii_digit_token_ids(key):
    with pytest.raises(ProtocolError) as e:
        limits.logit_bias({key: 1.0}, n_vocab=50)
    assert e.value.status == 400 and e.value.param == "logit_bias"


def test_limits():
    assert limits.logit_bias({"7": -100, "3": 2}, 50) == ((3, 2.0), (7, -100.0))
    assert limits.max_tokens(None, 64) == 64
    with pytest.raises(ProtocolError) as e:
        limits.max_tokens(65, 64, "max_completion_tokens")
    assert e.value.param == "max_completion_tokens"
    assert limits.stops("x") == ("x",)
    for bad in ([""], ["a"] * 17):
        with pytest.raises(ProtocolError):
            limits.stops(bad)
    with pytest.raises(ProtocolError):
        limits.sampling(temperature=-1, default_temperature=1.0)


def test_errors_render_openai_shaped():
    e = ProtocolError(429, "full", kind="overloaded", code="queue_full")
    assert body(e)["error"] == {"message": "full", "type": "rate_limit_error", "param": None,
                                "code": "queue_full"}
    a = APIError(404, "no", code="not_found")
    assert isinstance(a, ProtocolError) and a.kind == "not_found" and a.type == \
        "invalid_request_error"
    with pytest.raises(ValueError):
        ProtocolError(400, "x", kind="nonsense")


class Vocab:
    """A literal vocabulary: one id per character, special tokens by text or metadata."""

    n_vocab = 1000

    def __init__(self, special: dict[str, int], meta: dict[str, str] | None = None):
        self.special, self._meta = special, meta or {}

    def meta(self, key):
        return self._meta.get(key)

    def tokenize(self, text, add_special=True, parse_special=True):
        if parse_special and text in self.special:
            return [self.special[text]]
        return [ord(c) for c in text]


def test_fim_prompt_from_the_vocabulary_and_the_refusal_naming_the_model():
    v = Vocab({"<|fim_prefix|>": 900, "<|fim_suffix|>": 901, "<|fim_middle|>": 902,
               "<|file_sep|>": 903})
    assert fim_prompt(v, Fim("ab", "c"), "m", bos=1) == [1, 900, 97, 98, 901, 99, 902]
    extra = fim_prompt(v, Fim("a", "", (("x.py", "z"),)), "m")
    assert extra[0] == 903 and extra[-3:] == [97, 901, 902]
    meta = Vocab({}, {"tokenizer.ggml.fim_pre_token_id": "5",
                      "tokenizer.ggml.fim_suf_token_id": "6",
                      "tokenizer.ggml.fim_mid_token_id": "7"})
    assert (fim_tokens(meta).pre, fim_tokens(meta).mid) == (5, 7)
    with pytest.raises(ProtocolError) as e:
        fim_prompt(Vocab({}), Fim("a", "b"), "smollm2-135m")
    assert e.value.code == "fim_unsupported" and "smollm2-135m" in e.value.message
    with pytest.raises(ProtocolError):  # context files need a separator
        fim_prompt(Vocab({"<PRE>": 1, "<SUF>": 2, "<MID>": 3}), Fim("a", "", (("f", "t"),)), "m")


def test_a_core_request_has_exactly_one_prompt():
    p = GenerationParams()
    for kw in ({}, {"messages": MSG, "prompt": "x"}, {"prompt": ()}, {"prompt": (1, -2)},
               {"prompt": "x", "n": 0}, {"prompt": "x", "tools": ({},)}):
        with pytest.raises(ProtocolError):
            CoreRequest(model=None, params=p, **kw)
    assert CoreRequest(None, p, fim=Fim("a", "b")).kind == "fim"


# --- over the fake engine ---------------------------------------------------------------------
@pytest.fixture
def engine():
    return fake_engine(FakeModel())


def test_sync_run_yields_the_same_events_as_the_core(engine):
    req = CoreRequest(None, GenerationParams(max_tokens=5), prompt="a b c", n=2, echo=True)
    evs = list(run(engine, req))
    dones = [e for e in evs if isinstance(e, ChoiceDone)]
    assert [d.index for d in dones] == [0, 1] and dones[0].text == dones[1].text
    assert dones[0].text.startswith("a b c") and dones[0].completion_tokens == 5
    assert "".join(e.text for e in evs if isinstance(e, TextDelta) and e.index == 0) == \
        dones[0].text


def test_core_runs_n_choices_beyond_the_sequences_one_after_the_other(engine):
    sched = Scheduler(engine, parallel=1, max_queue=4)
    pool = ModelPool.single("fake", (), engine, sched)
    core = Core(pool, ServerSettings(served_model="fake"))
    params = GenerationParams(max_tokens=4)

    async def go():
        dones = await core.complete(None, CoreRequest(None, params, messages=MSG, n=3))
        with pytest.raises(ProtocolError) as e:
            await core.start(None, CoreRequest(None, params, messages=MSG, n=6))
        assert e.value.param == "n"
        return dones

    try:
        dones = asyncio.run(go())
    finally:
        sched.close()
    assert [d.index for d in dones] == [0, 1, 2]
    assert len({d.text for d in dones}) == 1  # greedy choices are equal


def test_the_default_model_and_alias_any_through_the_app(engine):
    def client(**kw):
        sched = Scheduler(engine, parallel=1, max_queue=4)
        return TestClient(create_app(sched, engine, ServerSettings(served_model="fake", **kw)))

    body_ = {"messages": list(MSG), "max_tokens": 3, "temperature": 0}
    with client() as c:
        assert c.post("/v1/chat/completions", json=body_).json()["model"] == "fake"
        r = c.post("/chat/completions", json={**body_, "model": "gpt-4o-mini"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = c.options("/v1/chat/completions", headers={"Access-Control-Request-Method": "POST"})
        assert r.status_code == 204 and "access-control-allow-origin" not in r.headers
        assert c.get("/models").json()["data"][0]["id"] == "fake"
    with client(model_alias_any=True) as c:
        r = c.post("/chat/completions", json={**body_, "model": "gpt-4o-mini"})
        assert r.status_code == 200 and r.json()["model"] == "gpt-4o-mini"
        r = c.post("/completions", json={"prompt": ["c d", "a b"], "max_tokens": 2, "n": 2,
                                         "echo": True, "temperature": 0})
        assert [ch["index"] for ch in r.json()["choices"]] == [0, 1, 2, 3]
        assert r.json()["choices"][2]["text"].startswith("a b")
        r = c.post("/completions", json={"prompt": [[3, 4], [5]], "max_tokens": 2})
        assert [ch["index"] for ch in r.json()["choices"]] == [0, 1]
        lines = [json.loads(line[6:]) for line in c.post(
            "/v1/chat/completions", json={**body_, "stream": True, "stream_options": {
                "include_origins": True}}).text.splitlines() if line.startswith("data: {")]
        assert all("tokens" in ch["edgespec"] for ch in lines[1:-1])
        assert "timings" in lines[-1]
