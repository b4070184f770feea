"""Tool calls and reasoning output through the server.

First without a model: a scripted scheduler (tests/fakes/scripted.py) plays outputs no pulled
model writes (a reasoning model's <think> block, a malformed call), in pieces as speculative
steps deliver them. Then a real `edgespec serve` on Qwen2.5-Coder 1.5B with speculation on
(the default proposer, auto), driven by the real openai client through a tool loop.
"""
from __future__ import annotations

import json

import pytest
from fakes import FakeModel
from fakes.engine import fake_engine
from fakes.scripted import TOOLS_TEMPLATE, ScriptedScheduler
from starlette.testclient import TestClient

from edgespec.grammar.constraint import constraint_for
from edgespec.server import ServerSettings, create_app

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def scripted(pieces, stop_reason="eos", template=TOOLS_TEMPLATE, **settings):
    sched = ScriptedScheduler(pieces, stop_reason)
    engine = fake_engine(FakeModel(chat_template=template))
    app = create_app(sched, engine, ServerSettings(served_model="fake", **settings))
    return sched, TestClient(app)


def chat(c, **body):
    return c.post("/v1/chat/completions", content=json.dumps({"model": "fake", **body}))


def stream(c, **body):
    r = chat(c, stream=True, **body)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def merged(chunks):
    """A stream's deltas put together the way OpenAI's client accumulates them."""
    content, reasoning, calls, finish = "", "", {}, None
    for ch in chunks:
        for choice in ch["choices"]:
            d = choice["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


# --- without a model -----------------------------------------------------------------------
THINKING = ["<thi", "nk>\nThe user wants", " a number.\n</th", "ink>\n\n", "Four", "."]


def test_a_thinking_models_block_is_split_into_reasoning_content():
    sched, c = scripted(THINKING)
    with c:
        msg = chat(c, messages=ASK).json()["choices"][0]["message"]
        assert msg["reasoning_content"] == "The user wants a number."
        assert msg["content"] == "Four."
        content, reasoning, calls, finish = merged(stream(c, messages=ASK))
        assert (content, reasoning, calls, finish) == \
            ("Four.", "The user wants a number.", [], "stop")
        # per request, as llama-server's reasoning_format: left in the content
        kept = chat(c, messages=ASK, reasoning_format="none").json()["choices"][0]["message"]
        assert kept["content"] == "".join(THINKING) and "reasoning_content" not in kept


def test_the_server_flag_sets_the_default_and_template_kwargs_open_the_block():
    sched, c = scripted(THINKING, reasoning_format="none")
    with c:
        assert chat(c, messages=ASK).json()["choices"][0]["message"]["content"] == \
            "".join(THINKING)
    # the template opens <think> itself when asked: the output starts inside the block
    sched, c = scripted(["Weigh it.", "</think>", "Four."])
    with c:
        msg = chat(c, messages=ASK, chat_template_kwargs={"enable_thinking": True}
                   ).json()["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == ("Weigh it.", "Four.")
        assert sched.calls[-1][1].template_vars == {"enable_thinking": True}


def test_a_scripted_call_is_tool_calls_whole_and_streamed():
    pieces = ["<think>Need data.</think>", "<tool", "_call>\n{\"name\": \"get_weather\", ",
              "\"arguments\": {\"city\": \"Par", "is\"}}\n</tool_c", "all>"]
    sched, c = scripted(pieces)
    with c:
        r = chat(c, messages=ASK, tools=[WEATHER]).json()
        choice = r["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        msg = choice["message"]
        assert msg["content"] is None and msg["reasoning_content"] == "Need data."
        (call,) = msg["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        # the tools reached the template (as template variables of the prompt)
        assert sched.calls[-1][1].template_vars["tools"] == [WEATHER]
        content, reasoning, calls, finish = merged(stream(c, messages=ASK, tools=[WEATHER]))
        assert content == "" and finish == "tool_calls"
        assert [(x["name"], x["arguments"]) for x in calls] == \
            [("get_weather", '{"city": "Paris"}')]


def test_a_malformed_call_is_content_with_its_own_finish_reason():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
    sched, c = scripted([bad[:20], bad[20:]])
    with c:
        r = chat(c, messages=ASK, tools=[WEATHER])
        assert r.status_code == 200
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "malformed_tool_call"
        assert choice["message"]["content"] == bad and "tool_calls" not in choice["message"]
        assert merged(stream(c, messages=ASK, tools=[WEATHER])) == \
            (bad, "", [], "malformed_tool_call")


def test_a_forced_call_is_generated_under_its_grammar():
    sched, c = scripted([CALL])
    with c:
        r = chat(c, messages=ASK, tools=[WEATHER],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 parallel_tool_calls=False)
        assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
        params = sched.calls[-1][1]
        assert params.grammar.startswith("root ::= tool-call\n")
        assert constraint_for(params).kind == "grammar"


def test_one_call_only_ends_the_output_at_the_first_calls_closing_tag():
    # the engine stops at the stop string and removes it; the turn restores the closing tag
    sched, c = scripted([CALL[:-len("</tool_call>")]], stop_reason="stop")
    with c:
        r = chat(c, messages=ASK, tools=[WEATHER], parallel_tool_calls=False, stop=["END"])
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert [t["function"]["name"] for t in choice["message"]["tool_calls"]] == ["get_weather"]
        assert sched.calls[-1][1].stop == ("END", "</tool_call>")
        chat(c, messages=ASK, tools=[WEATHER], stop=["END"])
        assert sched.calls[-1][1].stop == ("END",)  # parallel calls: no stop of its own


@pytest.mark.parametrize("body,status,param,code,words", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}]},
     400, "tools.0.function.parameters", "invalid_tool_schema", "not a valid JSON Schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     400, "tool_choice.function.name", "tool_not_found", "'nope', which is not among"),
    ({"tool_choice": "required"}, 400, "tool_choice", "invalid_value", "needs tools"),
    ({"tools": [WEATHER], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, 400, "response_format", "invalid_value",
     "cannot be combined"),
    ({"chat_template_kwargs": {"messages": []}}, 400, "chat_template_kwargs.messages",
     "invalid_value", "may not set"),
    ({"reasoning_format": "raw"}, 400, "reasoning_format", "invalid_value", "Input should be"),
])
def test_bad_tool_input_is_refused_in_the_openai_shape(body, status, param, code, words):
    sched, c = scripted(["x"])
    with c:
        r = chat(c, messages=ASK, **body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert (err["param"], err["code"]) == (param, code) and words in err["message"]
        assert sched.calls == []


def test_tools_for_a_template_without_tool_support_are_refused_naming_the_model():
    from fakes.backend import CHAT_TEMPLATE
    sched, c = scripted(["x"], template=CHAT_TEMPLATE)
    with c:
        r = chat(c, messages=ASK, tools=[WEATHER])
        assert r.status_code == 400
        err = r.json()["error"]
        assert (err["param"], err["code"]) == ("tools", "tools_unsupported")
        assert "the model 'fake' has no tool support" in err["message"]
        assert chat(c, messages=ASK).status_code == 200  # without tools it serves


# --- a real server: Qwen2.5-Coder 1.5B, speculation on ------------------------------------
REAL = "qwen-1.5b"
GREEDY = {"temperature": 0.0}
LOOKUP = [{"role": "system", "content": "You are a weather assistant. Always use the "
                                        "get_weather tool to look the weather up."},
          {"role": "user", "content": "What is the weather in Paris right now?"}]
RESULT = {"city": "Paris", "temperature_c": 18, "sky": "sunny"}


def _serve(model_path, *flags):
    from server_env import THREADS

    from tools.soak import ServeProcess
    model_path(REAL)
    return ServeProcess(["--target", REAL, "--ctx", "2048", "--threads", THREADS,
                         "--max-tokens-limit", "256", *flags], startup_seconds=600)


@pytest.fixture(scope="module")
def qwen(model_path):
    """The default configuration: --proposer auto (the planner picks the proposers)."""
    with _serve(model_path) as s:
        yield s


@pytest.fixture(scope="module")
def qwen_client(qwen):
    from openai import OpenAI
    with OpenAI(base_url=qwen.base_url + "/v1", api_key="unused", max_retries=0,
                timeout=600) as c:
        yield c


def _answer(client, messages, stream, **kw):
    """(message dict, finish_reason, edgespec stats) of one turn, streamed or not."""
    if not stream:
        r = client.chat.completions.create(model=REAL, messages=messages, **kw)
        msg = r.choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": c.function.arguments}}
            for c in msg.tool_calls or []]
        return ({"role": "assistant", "content": msg.content, "tool_calls": calls},
                r.choices[0].finish_reason, r.model_extra["edgespec"])
    chunks = list(client.chat.completions.create(model=REAL, messages=messages, stream=True,
                                                 **kw))
    content, reasoning, calls, finish = merged([c.model_dump() for c in chunks])
    assert reasoning == "" and "<tool_call>" not in content  # no markup leaks into content
    ext = next(c.model_extra["edgespec"] for c in chunks if c.model_extra.get("edgespec"))
    return ({"role": "assistant", "content": content or None, "tool_calls": [
        {"id": c["id"], "type": "function",
         "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]},
        finish, ext)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_openai_client_runs_a_tool_loop(qwen_client, stream):
    # "required": left free, Qwen2.5 1.5B's first token is a near-tie between <tool_call> and
    # copying its template's {{"name": ...}} example, which a long-lived default server (its
    # suffix store learns from earlier requests) can decide either way outside --exact
    msg, finish, ext = _answer(qwen_client, LOOKUP, stream, tools=[WEATHER], max_tokens=48,
                               tool_choice="required", **GREEDY)
    assert finish == "tool_calls", msg
    (call,) = msg["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert ext["proposer"] != "none"  # speculation on
    history = [*LOOKUP, msg, {"role": "tool", "tool_call_id": call["id"],
                              "content": json.dumps(RESULT)}]
    final, finish, _ = _answer(qwen_client, history, stream, tools=[WEATHER], max_tokens=40,
                               **GREEDY)
    assert finish in ("stop", "length") and not final["tool_calls"]
    assert "18" in final["content"]  # the answer uses the tool's result


def test_a_named_tool_choice_forces_a_schema_valid_call(qwen_client):
    import jsonschema
    convert = {"type": "function", "function": {
        "name": "convert", "description": "Convert an amount of money",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "currency": {"enum": ["EUR", "USD", "JPY"]}},
            "required": ["amount", "currency"]}}}
    r = qwen_client.chat.completions.create(
        model=REAL, messages=[{"role": "user", "content": "Say hello."}],
        tools=[WEATHER, convert], tool_choice={"type": "function", "function": {"name": "convert"}},
        max_tokens=64, **GREEDY)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls  # parallel calls allowed, but the grammar ends at one
    assert call.function.name == "convert"
    jsonschema.validate(json.loads(call.function.arguments),
                        convert["function"]["parameters"])
    ext = r.model_extra["edgespec"]
    assert ext["stop_reason"] in ("eos", "grammar") and ext["accepted"] > 0


def test_greedy_tool_call_turn_is_the_plain_paths(qwen_client, model_path):
    """The tool-call turn with speculation (the default, auto) and without (--proposer none)."""
    # a required call: see test_the_openai_client_runs_a_tool_loop
    spec, finish, ext = _answer(qwen_client, LOOKUP, False, tools=[WEATHER], max_tokens=48,
                                tool_choice="required", **GREEDY)
    assert finish == "tool_calls" and ext["proposer"] != "none"
    from openai import OpenAI
    with _serve(model_path, "--proposer", "none") as plain_server, \
            OpenAI(base_url=plain_server.base_url + "/v1", api_key="unused", max_retries=0,
                   timeout=600) as plain_client:
        plain, plain_finish, plain_ext = _answer(plain_client, LOOKUP, False, tools=[WEATHER],
                                                 max_tokens=48, tool_choice="required",
                                                 **GREEDY)
    assert plain_ext["proposer"] == "none" and plain_finish == finish
    assert plain["content"] == spec["content"]
    assert [c["function"] for c in plain["tool_calls"]] == [c["function"] for c in spec["tool_calls"]]


def test_a_real_think_block_streams_as_reasoning_content(qwen_client):
    """Qwen2.5 does not think on its own; asked to repeat a <think> block, it writes one, and
    the real streaming path (speculative steps of several tokens) splits it off."""
    messages = [{"role": "user", "content": "Repeat this text exactly, character for "
                                            "character, and write nothing else:\n"
                                            "<think>2 + 2 = 4</think>The answer is 4."}]
    chunks = list(qwen_client.chat.completions.create(model=REAL, messages=messages,
                                                      stream=True, max_tokens=32, **GREEDY))
    content, reasoning, _, finish = merged([c.model_dump() for c in chunks])
    assert (reasoning, content, finish) == ("2 + 2 = 4", "The answer is 4.", "stop")
    assert not any("<think>" in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    whole = qwen_client.chat.completions.create(model=REAL, messages=messages, max_tokens=32,
                                                **GREEDY).choices[0].message
    assert (whole.model_extra["reasoning_content"], whole.content) == (reasoning, content)
    kept = qwen_client.chat.completions.create(model=REAL, messages=messages, max_tokens=32,
                                               extra_body={"reasoning_format": "none"}, **GREEDY)
    assert kept.choices[0].message.content == "<think>2 + 2 = 4</think>The answer is 4."


def test_tools_for_smollm2_are_refused_naming_it(client):
    """SmolLM2's template has no tool support: the real server refuses rather than drop them."""
    import openai
    from server_env import MODEL
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=4)
    err = e.value.body
    assert err["code"] == "tools_unsupported" and f"the model {MODEL!r}" in err["message"]
