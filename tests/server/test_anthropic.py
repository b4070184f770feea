"""Anthropic Messages (edgespec.server.dialects.anthropic): the wire format parsed into the
core's request and the core's events rendered back, on literal bodies and events; then the
real ``anthropic`` SDK against a real `edgespec serve` (smollm2-135m)."""
from __future__ import annotations

import json

import pytest

from edgespec.api.stats import RequestStats
from edgespec.protocol.errors import ProtocolError
from edgespec.protocol.events import ChoiceDone, ReasoningDelta, TextDelta, ToolCall, \
    ToolCallDelta
from edgespec.server.dialects import anthropic as am
from edgespec.server.settings import ServerSettings

SETTINGS = ServerSettings(served_model="m", max_tokens_limit=512)


def parse(**body):
    body.setdefault("model", "m")
    body.setdefault("max_tokens", 16)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return am.parse(json.dumps(body), SETTINGS)


def refused(**body) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        parse(**body)
    return e.value


def done(text="", *, finish="stop", stop_reason="eos", reasoning=None, calls=(),
         prompt=7, completion=3, cached=0) -> ChoiceDone:
    return ChoiceDone(0, finish, stop_reason, text, reasoning, tuple(calls), prompt, completion,
                      {"predicted_n": completion}, RequestStats(), prompt_cached=cached)


# --- parsing ---------------------------------------------------------------------------------
def test_a_tool_round_trip_becomes_openai_messages():
    req, stream = parse(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "call it", "signature": "x"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "18C"}]},
                {"type": "text", "text": "And tomorrow?"}]}],
        tools=[{"name": "weather", "description": "Weather now",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        stop_sequences=["END"], temperature=0.5, top_k=40, stream=True,
        metadata={"user_id": "u1"})
    assert stream
    assert req.messages == (
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": "And tomorrow?"})
    assert req.tools == ({"type": "function", "function": {
        "name": "weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},)
    assert req.tool_choice == {"type": "function", "function": {"name": "weather"}}
    assert req.parallel_tool_calls is False
    assert req.params.stop == ("END",) and req.params.max_tokens == 16
    assert req.params.sampling.temperature == 0.5 and req.params.sampling.top_k == 40


@pytest.mark.parametrize("choice, expected", [({"type": "auto"}, "auto"),
                                              ({"type": "any"}, "required"),
                                              ({"type": "none"}, "none")])
def test_tool_choice_maps_onto_openai_words(choice, expected):
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    assert parse(tools=tools, tool_choice=choice)[0].tool_choice == expected


def test_thinking_maps_onto_the_reasoning_split():
    on = parse(thinking={"type": "enabled", "budget_tokens": 1024})[0]
    off = parse(thinking={"type": "disabled"})[0]
    assert on.reasoning_format == "deepseek" and on.chat_template_kwargs is None
    assert off.chat_template_kwargs == {"enable_thinking": False}
    assert parse()[0].reasoning_format is None  # the server's default


def test_an_error_tool_result_is_marked():
    req, _ = parse(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "boom", "is_error": True}]}])
    assert req.messages[1]["content"] is None
    assert req.messages[-1] == {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"}


@pytest.mark.parametrize("body, param, words", [
    ({"max_tokens": None}, "max_tokens", "required"),
    ({"max_tokens": "5"}, "max_tokens", "must be an integer"),
    ({"max_tokens": 100000}, "max_tokens", "at most 512"),
    ({"messages": []}, "messages", "empty"),
    ({"messages": "hi"}, "messages", "must be an array"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role", "'user' or"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages.0.content.0.type", "not supported"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]},
     "messages.0.content.0.tool_use_id", "answers no tool_use"),
    ({"temperature": 1.5}, "temperature", "[0, 1]"),
    ({"temperature": True}, "temperature", "must be a number"),
    ({"stop_sequences": [""]}, "stop_sequences", "non-empty"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type",
     "server tools"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type", "'auto', 'any'"),
    ({"thinking": {"type": "maybe"}}, "thinking.type", "'enabled' or 'disabled'"),
])
def test_bad_input_names_its_field(body, param, words):
    err = refused(**body)
    assert err.status == 400 and err.param == param and words in err.message


def test_a_body_that_is_not_an_object_is_refused():
    for text in ("{", "[1]"):
        with pytest.raises(ProtocolError) as e:
            am.parse(text, SETTINGS)
        assert e.value.status == 400


def test_count_tokens_needs_no_max_tokens():
    req, _ = am.parse(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                      SETTINGS, count_only=True)
    assert req.messages == ({"role": "user", "content": "x"},)


# --- rendering -------------------------------------------------------------------------------
def test_a_whole_answer_has_thinking_text_and_tool_use_blocks():
    d = done("Checking.", finish="tool_calls", reasoning="think first",
             calls=[ToolCall("call_1", "weather", '{"city": "Paris"}')], prompt=10, cached=4)
    msg = am.message(d, "m", (), msg_id="msg_1")
    assert msg["content"] == [
        {"type": "thinking", "thinking": "think first", "signature": ""},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]
    assert msg["stop_reason"] == "tool_use" and msg["stop_sequence"] is None
    assert msg["usage"] == {"input_tokens": 6, "output_tokens": 3,
                            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4}
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["id"] == "msg_1"


@pytest.mark.parametrize("kw, stops, reason, sequence", [
    ({"stop_reason": "eos"}, (), "end_turn", None),
    ({"finish": "length", "stop_reason": "length"}, (), "max_tokens", None),
    ({"stop_reason": "stop"}, ("END",), "stop_sequence", "END"),
    ({"stop_reason": "stop"}, ("A", "B"), "stop_sequence", None),
])
def test_stop_reasons(kw, stops, reason, sequence):
    msg = am.message(done("x", **kw), "m", stops)
    assert (msg["stop_reason"], msg["stop_sequence"]) == (reason, sequence)


def test_the_stream_is_anthropics_event_sequence():
    s = am.MessageStream("m", id="msg_1")
    events = s.start()
    for ev in [ReasoningDelta(0, "hm"), ReasoningDelta(0, "m"), TextDelta(0, "Hel"),
               TextDelta(0, "lo"), ToolCallDelta(0, 0, "call_a", "f", ""),
               ToolCallDelta(0, 0, None, None, '{"x": 1}'),
               ToolCallDelta(0, 1, "call_b", "g", ""), ToolCallDelta(0, 1, None, None, "{}")]:
        events += s.feed(ev)
    events += s.feed(done("Hello", finish="tool_calls", reasoning="hmm",
                          calls=[ToolCall("call_a", "f", '{"x": 1}'), ToolCall("call_b", "g", "{}")]))
    names = [n for n, _ in events]
    assert names == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    starts = [d for n, d in events if n == "content_block_start"]
    assert [d["index"] for d in starts] == [0, 1, 2, 3]
    assert [d["content_block"]["type"] for d in starts] == ["thinking", "text", "tool_use",
                                                           "tool_use"]
    assert starts[2]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "f",
                                          "input": {}}
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert deltas[0] == {"type": "thinking_delta", "thinking": "hm"}
    assert deltas[2] == {"type": "text_delta", "text": "Hel"}
    assert deltas[4] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == 3
    assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["id"] == "msg_1"


def test_an_empty_answer_still_streams_one_text_block():
    s = am.MessageStream("m")
    names = [n for n, _ in s.start() + s.feed(done(""))]
    assert names == ["message_start", "ping", "content_block_start", "content_block_stop",
                     "message_delta", "message_stop"]


def test_errors_are_anthropic_shaped():
    assert am.error_body(404, "no model") == {
        "type": "error", "error": {"type": "not_found_error", "message": "no model"}}
    assert am.error_body(400, "x")["error"]["type"] == "invalid_request_error"
    assert am.error_body(429, "x")["error"]["type"] == "rate_limit_error"
    assert am.error_body(503, "x")["error"]["type"] == "overloaded_error"
    assert am.error_body(500, "x")["error"]["type"] == "api_error"


# --- the real anthropic SDK, a scripted model (tool calls, thinking) -------------------------
WEATHER = {"name": "get_weather", "description": "The current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def scripted():
    from scripted_serve import scripted_server

    with scripted_server(["x"]) as (url, sched):
        yield url, sched


def sdk(url: str, **kw):
    import anthropic
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60, **kw)


def test_sdk_tool_use_then_tool_result_round_trip(scripted):
    from scripted_serve import CALL

    url, sched = scripted
    client = sdk(url)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    sched.pieces = CALL
    first = client.messages.create(model="fake", max_tokens=64, messages=ask, tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}

    sched.pieces = ["It is ", "sunny."]
    second = client.messages.create(model="fake", max_tokens=64, tools=[WEATHER], messages=[
        *ask, {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "sunny, 21C"}]}])
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].text == "It is sunny." and second.stop_reason == "end_turn"
    sent = sched.calls[-1][0]  # the messages the engine was given
    assert sent[-1]["role"] == "tool" and sent[-1]["tool_call_id"] == use.id
    assert sent[-1]["content"] == "sunny, 21C"
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_sdk_stream_of_a_tool_call_accumulates_its_input(scripted):
    from scripted_serve import CALL

    url, sched = scripted
    sched.pieces = ["Let me check. ", *CALL]
    with sdk(url).messages.stream(model="fake", max_tokens=64, tools=[WEATHER], messages=[
            {"role": "user", "content": "Weather in Paris?"}]) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Let me check."
    assert final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_sdk_thinking_blocks_from_the_reasoning_split(scripted):
    url, sched = scripted
    sched.pieces = ["<think>", "Two and ", "two.</think>", "4"]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    ask = [{"role": "user", "content": "2+2?"}]
    whole = sdk(url).messages.create(model="fake", max_tokens=64, messages=ask,
                                     thinking=thinking)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in whole.content] == [("thinking", "Two and two."), ("text", "4")]
    with sdk(url).messages.stream(model="fake", max_tokens=64, messages=ask,
                                  thinking=thinking) as stream:
        deltas = [ev.delta.type for ev in stream if ev.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in deltas and "text_delta" in deltas
    assert final.content[0].thinking == "Two and two." and final.content[1].text == "4"


# --- the real anthropic SDK on a real `edgespec serve` (smollm2-135m) ------------------------
ASK = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0}


def test_sdk_text_stream_and_count_tokens(server):
    from server_env import MODEL

    client = sdk(server.base_url)
    whole = client.messages.create(model=MODEL, max_tokens=8, messages=ASK, extra_body=GREEDY)
    assert whole.model == MODEL and whole.role == "assistant"
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text
    assert whole.stop_reason in ("max_tokens", "end_turn") and 0 < whole.usage.output_tokens <= 8
    prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens

    with client.messages.stream(model=MODEL, max_tokens=8, messages=ASK,
                                extra_body=GREEDY) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.content[0].text == whole.content[0].text  # greedy: the same answer
    assert final.stop_reason == whole.stop_reason

    counted = client.messages.count_tokens(model=MODEL, messages=ASK)
    assert counted.input_tokens == prompt


def test_sdk_errors_are_anthropic_shaped(server):
    import anthropic

    client = sdk(server.base_url)
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=4, messages=ASK)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="x", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                          "content": "18C"}]}])
    assert "answers no tool_use" in e.value.body["error"]["message"]


@pytest.mark.parametrize("body, words", [
    (b"{not json", "not valid JSON"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}', "max_tokens is required"),
    (b'{"model": "m", "max_tokens": "8", "messages": [{"role": "user", "content": "x"}]}',
     "max_tokens must be an integer"),
])
def test_malformed_bodies_are_anthropic_shaped(server, body, words):
    status, _, raw = server.request("POST", "/v1/messages", body)
    err = json.loads(raw)
    assert status == 400 and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error" and words in err["error"]["message"]


def test_an_over_context_prompt_is_refused_anthropic_shaped(server):
    from server_env import MODEL

    long = " ".join(["word"] * 1500)  # the server's context holds 1024 tokens
    status, _, raw = server.request("POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": long}]})
    err = json.loads(raw)
    assert status == 400 and err["error"]["type"] == "invalid_request_error"
    assert "context" in err["error"]["message"]
    assert server.wait_idle(15)["running"] == 0


# --- the SSE generator: errors in-stream, a client gone ---------------------------------------
class FakeRun:
    """A core run that yields ``events`` then raises ``error`` (if any)."""

    def __init__(self, events, error=None):
        self.events, self.error, self.cancelled = events, error, False

    def cancel(self):
        self.cancelled = True

    async def __aiter__(self):
        for ev in self.events:
            yield ev
        if self.error is not None:
            raise self.error


def test_a_failure_after_the_start_is_an_error_event():
    import asyncio

    async def go():
        run = FakeRun([TextDelta(0, "Hi")], ProtocolError(503, "dropped", kind="server_error"))
        return [e async for e in am._sse(run, am.MessageStream("m"))], run

    events, run = asyncio.run(go())
    assert [e["event"] for e in events][-1] == "error"
    assert json.loads(events[-1]["data"]) == {
        "type": "error", "error": {"type": "overloaded_error", "message": "dropped"}}
    assert not run.cancelled  # it ended on its own


def test_a_client_gone_mid_stream_cancels_the_run():
    import asyncio

    async def go():
        run = FakeRun([TextDelta(0, "a"), TextDelta(0, "b")])
        gen = am._sse(run, am.MessageStream("m"))
        await gen.__anext__()  # message_start, then the client goes away
        await gen.aclose()
        return run

    assert asyncio.run(go()).cancelled
