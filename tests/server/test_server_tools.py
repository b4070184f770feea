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
                slot["name"] += tc.get("function", {}).get("name", "")
                slot["arguments"] += tc.get("function", {}).get("arguments", "")
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
        assert params.constraint().kind == "grammar"


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
