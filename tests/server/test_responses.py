"""The OpenAI Responses API (edgespec.server.dialects.responses): the wire format parsed
into the core's request and the core's events rendered back, on literal bodies and events;
then the real ``openai`` SDK's ``responses`` against a real `edgespec serve` (smollm2-135m)."""
from __future__ import annotations

import json

import pytest

from edgespec.api.stats import RequestStats
from edgespec.protocol.errors import ProtocolError
from edgespec.protocol.events import ChoiceDone, ReasoningDelta, TextDelta, ToolCall, \
    ToolCallDelta
from edgespec.server.dialects import responses as rs
from edgespec.server.dialects.responses_store import ResponseStore, Stored
from edgespec.server.settings import ServerSettings

SETTINGS = ServerSettings(served_model="m", max_tokens_limit=512)


def parse(held: ResponseStore | None = None, **body) -> rs.Parsed:
    body.setdefault("model", "m")
    body.setdefault("input", "hi")
    return rs.parse(json.dumps(body), SETTINGS, held or ResponseStore())


def refused(**body) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        parse(**body)
    return e.value


def done(text="", *, finish="stop", stop_reason="eos", reasoning=None, calls=(),
         prompt=7, completion=3, cached=0) -> ChoiceDone:
    return ChoiceDone(0, finish, stop_reason, text, reasoning, tuple(calls), prompt, completion,
                      {"predicted_n": completion}, RequestStats(), prompt_cached=cached)


# --- parsing ---------------------------------------------------------------------------------
def test_items_become_openai_messages():
    p = parse(instructions="Be brief.", input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "weather",
         "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "function_call_output", "call_id": "call_2", "output": "25C"},
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer now."}]}],
        tools=[{"type": "function", "name": "weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True}],
        tool_choice={"type": "function", "name": "weather"}, parallel_tool_calls=False,
        max_output_tokens=20, temperature=0.2, stream=True, store=False)
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
             {"id": "call_2", "type": "function",
              "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]
    assert p.core.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
        {"role": "system", "content": "Answer now."})
    assert p.conversation == p.core.messages[1:]  # instructions are not carried on
    assert p.core.tools[0]["function"]["name"] == "weather"
    assert p.core.tools[0]["function"]["strict"] is True
    assert p.core.tool_choice == {"type": "function", "function": {"name": "weather"}}
    assert p.core.parallel_tool_calls is False
    assert p.core.params.max_tokens == 20 and p.core.params.sampling.temperature == 0.2
    assert p.stream and not p.store
    assert p.echo["max_output_tokens"] == 20 and p.echo["instructions"] == "Be brief."


def test_text_format_json_schema_constrains_the_output():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = parse(text={"format": {"type": "json_schema", "name": "x", "schema": schema}})
    assert p.core.params.json_schema == schema
    assert parse(text={"format": {"type": "json_object"}}).core.params.json_mode


def test_previous_response_id_continues_its_conversation():
    store = ResponseStore()
    before = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"})
    store.put("resp_1", Stored({"id": "resp_1"}, before))
    p = parse(store, input="And you?", previous_response_id="resp_1", instructions="Short.")
    assert p.core.messages == ({"role": "system", "content": "Short."}, *before,
                               {"role": "user", "content": "And you?"})
    with pytest.raises(ProtocolError) as e:
        parse(store, previous_response_id="resp_unknown")
    assert e.value.status == 404 and e.value.param == "previous_response_id"


def test_a_call_output_may_answer_a_call_of_the_previous_response():
    store = ResponseStore()
    call = {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    store.put("resp_1", Stored({}, ({"role": "user", "content": "go"},
                                    {"role": "assistant", "content": None, "tool_calls": [call]})))
    p = parse(store, previous_response_id="resp_1",
              input=[{"type": "function_call_output", "call_id": "call_9", "output": "ok"}])
    assert p.core.messages[-1] == {"role": "tool", "tool_call_id": "call_9", "content": "ok"}


def test_the_store_is_bounded():
    store = ResponseStore(limit=2)
    for i in range(3):
        store.put(f"r{i}", Stored({}, ()))
    assert store.get("r0") is None and store.get("r2") is not None and len(store) == 2


@pytest.mark.parametrize("body, param, words", [
    ({"input": None}, "input", "required"),
    ({"input": 5}, "input", "must be a string or an array"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
     "input.0.call_id", "answers no function_call"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0.type", "only text"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role", "user, assistant"),
    ({"input": [{"type": "computer_call", "call_id": "c"}]}, "input.0.type", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type", "hosted tools"),
    ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ({"max_output_tokens": 100000}, "max_output_tokens", "at most 512"),
    ({"temperature": "hot"}, "temperature", "must be a number"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "json_schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema",
     "required"),
    ({"background": True}, "background", "not supported"),
])
def test_bad_input_names_its_field(body, param, words):
    err = refused(**body)
    assert err.status == 400 and err.param == param and words in err.message


# --- rendering -------------------------------------------------------------------------------
def test_a_whole_answer_has_reasoning_message_and_call_items():
    d = done("Checking.", finish="tool_calls", reasoning="think",
             calls=[ToolCall("call_1", "weather", '{"city": "Paris"}')], prompt=10, cached=4)
    out = rs.output_items(d)
    assert [it["type"] for it in out] == ["reasoning", "message", "function_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert out[1]["content"][0]["text"] == "Checking." and out[1]["role"] == "assistant"
    assert {k: out[2][k] for k in ("call_id", "name", "arguments", "status")} == {
        "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}',
        "status": "completed"}
    body = rs.response_object("resp_1", parse().echo, 0, rs.status_of(d), out, d)
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
                             "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 13}
    assert rs.answer_message(out) == {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}


def test_an_answer_cut_short_is_incomplete():
    d = done("abc", finish="length", stop_reason="length")
    body = rs.response_object("r", parse().echo, 0, rs.status_of(d), rs.output_items(d), d)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_stream_is_the_responses_event_sequence():
    s = rs.ResponseStream(parse().echo, id="resp_1")
    events = s.start()
    for ev in [ReasoningDelta(0, "hm"), TextDelta(0, "Hel"), TextDelta(0, "lo"),
               ToolCallDelta(0, 0, "call_a", "f", ""),
               ToolCallDelta(0, 0, None, None, '{"x": 1}')]:
        events += s.feed(ev)
    events += s.feed(done("Hello", finish="tool_calls", reasoning="hm",
                          calls=[ToolCall("call_a", "f", '{"x": 1}')]))
    names = [n for n, _ in events]
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(d["type"] == n for n, d in events)
    assert events[0][1]["response"]["status"] == "in_progress"
    text_done = events[names.index("response.output_text.done")][1]
    assert text_done["text"] == "Hello" and text_done["output_index"] == 1
    args_done = events[names.index("response.function_call_arguments.done")][1]
    assert args_done["arguments"] == '{"x": 1}' and args_done["output_index"] == 2
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["id"] == "resp_1"
    added = [d["item"]["id"] for n, d in events if n == "response.output_item.added"]
    assert [it["id"] for it in final["output"]] == added  # the ids streamed are the ids kept
    assert final["output"][2]["call_id"] == "call_a"
    assert s.response is final


def test_errors_are_openai_shaped():
    from edgespec.server.dialects.refusal import to_protocol
    from edgespec.server.errors import body

    err = to_protocol(ProtocolError(404, "gone", kind="not_found",
                                    param="previous_response_id", code="x"))
    assert body(err) == {"error": {"message": "gone", "type": "invalid_request_error",
                                   "param": "previous_response_id", "code": "x"}}
    bug = to_protocol(RuntimeError("boom"))
    assert bug.status == 500 and body(bug)["error"]["type"] == "server_error"


# --- the real openai SDK, a scripted model (function calls) ----------------------------------
WEATHER = {"type": "function", "name": "get_weather",
           "description": "The current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def scripted():
    from scripted_serve import scripted_server

    with scripted_server(["x"]) as (url, sched):
        yield url, sched


def sdk(url: str):
    from openai import OpenAI
    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_sdk_function_call_then_its_output_by_previous_response_id(scripted):
    from scripted_serve import CALL

    url, sched = scripted
    client = sdk(url)
    sched.pieces = CALL
    first = client.responses.create(model="fake", input="Weather in Paris?", tools=[WEATHER],
                                    instructions="Use the tools.")
    (call,) = [it for it in first.output if it.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert first.status == "completed"

    sched.pieces = ["Sunny", " in Paris."]
    second = client.responses.create(
        model="fake", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21C"}])
    assert second.output_text == "Sunny in Paris."
    assert second.previous_response_id == first.id
    sent = sched.calls[-1][0]  # the conversation the engine was given
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]  # no instructions
    assert sent[1]["tool_calls"][0]["id"] == call.call_id
    assert sent[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "21C",
                       "name": "get_weather"}
    assert client.responses.retrieve(second.id).output_text == "Sunny in Paris."


def test_sdk_stream_of_a_function_call(scripted):
    from scripted_serve import CALL

    url, sched = scripted
    sched.pieces = ["Checking. ", *CALL]
    events = list(sdk(url).responses.create(model="fake", input="Weather in Paris?",
                                            tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert [it.type for it in final.output] == ["message", "function_call"]
    assert final.output_text == "Checking."
    assert json.loads(final.output[1].arguments) == {"city": "Paris"}


# --- the real openai SDK on a real `edgespec serve` (smollm2-135m) ---------------------------
def test_sdk_text_stream_and_previous_response(server):
    from server_env import MODEL

    client = sdk(server.base_url)
    first = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8,
                                    temperature=0)
    assert first.object == "response" and first.model == MODEL
    assert first.status in ("completed", "incomplete") and first.output_text
    assert 0 < first.usage.output_tokens <= 8

    events = list(client.responses.create(model=MODEL, input="Say hello.",
                                          max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    for kind in ("response.output_item.added", "response.content_part.added",
                 "response.output_text.delta", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done"):
        assert kind in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == first.output_text  # greedy: the same

    second = client.responses.create(model=MODEL, input="Again.", previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0)
    assert second.previous_response_id == first.id
    # the follow-up's prompt holds the first turn: more tokens than "Again." alone
    assert second.usage.input_tokens > first.usage.input_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text


def test_sdk_errors_are_openai_shaped(server):
    import openai
    from server_env import MODEL

    client = sdk(server.base_url)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="no-such-model", input="x", max_output_tokens=4)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b'{"input": 5}', "input"),
    (b'{"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}',
     "input.0.call_id"),
    (b'{"input": "x", "max_output_tokens": "8"}', "max_output_tokens"),
])
def test_malformed_bodies_are_openai_shaped(server, body, param):
    status, _, raw = server.request("POST", "/v1/responses", body)
    err = json.loads(raw)["error"]
    assert status == 400 and err["type"] == "invalid_request_error" and err["param"] == param


def test_an_over_context_prompt_is_refused_openai_shaped(server):
    status, _, raw = server.request("POST", "/v1/responses", {
        "input": " ".join(["word"] * 1500), "max_output_tokens": 4})
    err = json.loads(raw)["error"]
    assert status == 400 and err["code"] == "context_length_exceeded"
    assert server.wait_idle(15)["running"] == 0


# --- the SSE generator: errors in-stream, the store, a client gone ----------------------------
class FakeRun:
    def __init__(self, events, error=None):
        self.events, self.error, self.cancelled = events, error, False

    def cancel(self):
        self.cancelled = True

    async def __aiter__(self):
        for ev in self.events:
            yield ev
        if self.error is not None:
            raise self.error


def sse(run, parsed, store):
    import asyncio

    async def go():
        return [e async for e in rs._sse(run, rs.ResponseStream(parsed.echo), parsed, store)]
    return asyncio.run(go())


def test_a_streamed_answer_is_stored_and_a_failure_is_an_error_event():
    store = ResponseStore()
    p = parse()
    events = sse(FakeRun([TextDelta(0, "Hi"), done("Hi")]), p, store)
    final = json.loads(events[-1]["data"])["response"]
    assert store.get(final["id"]).conversation[-1] == {"role": "assistant", "content": "Hi"}

    events = sse(FakeRun([TextDelta(0, "Hi")], ProtocolError(503, "dropped",
                                                              kind="server_error",
                                                              code="dropped")), p, store)
    last = json.loads(events[-1]["data"])
    assert events[-1]["event"] == "error" and last["code"] == "dropped"
    assert last["sequence_number"] == len(events) - 1 and len(store) == 1


def test_a_client_gone_mid_stream_cancels_the_run():
    import asyncio

    async def go():
        run = FakeRun([TextDelta(0, "a"), TextDelta(0, "b")])
        p = parse()
        gen = rs._sse(run, rs.ResponseStream(p.echo), p, ResponseStore())
        await gen.__anext__()
        await gen.aclose()
        return run

    assert asyncio.run(go()).cancelled
