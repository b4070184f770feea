"""Tool calls through the llama-cpp-python-shaped API (edgespec.agents underneath), on Qwen2.5
0.5B, whose chat template declares tools: a named call constrained by its schema, an
``auto`` call parsed out of the model's markup, streamed as ``delta.tool_calls``, a tool
loop, and the refusals."""
from __future__ import annotations

import json

import pytest

from edgespec.errors import InvalidInputError, UnsupportedError

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
COMMON = dict(n_ctx=1024, n_threads=2, seed=7, verbose=False)


@pytest.fixture(scope="module")
def qwen(model_path):
    from edgespec.apps import Llama
    with Llama(model_path=str(model_path("qwen-0.5b")), **COMMON, proposer="ngram+suffix",
               adaptive=False) as llm:
        yield llm


def test_named_tool_call_has_llama_cpp_shape(qwen, model_path):
    out = qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice=NAMED, temperature=0,
                                      max_tokens=48)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    assert msg["content"] is None and msg["function_call"] == call["function"]
    # the keys llama-cpp-python's own named-tool answer has
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(model_path=str(model_path("qwen-0.5b")), **COMMON)
    try:
        theirs = ref.create_chat_completion(ASK, tools=TOOLS, tool_choice=NAMED, temperature=0,
                                            max_tokens=24)
    finally:
        ref.close()
    assert set(theirs["choices"][0]["message"]) == set(msg)
    assert set(theirs["choices"][0]["message"]["tool_calls"][0]) == set(call)
    assert theirs["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_tool_call_streams_and_closes_the_loop(qwen):
    chunks = list(qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice="auto",
                                              temperature=0, max_tokens=48, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"} and deltas[-1] == {}
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls and calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert isinstance(json.loads(arguments)["city"], str)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # the tool's answer goes back; the model answers in text
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0]["id"], "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C and sunny"}]
    out = qwen.create_chat_completion(history, tools=TOOLS, temperature=0, max_tokens=24)
    assert out["choices"][0]["message"]["content"]
    assert "tool_calls" not in out["choices"][0]["message"]


def test_legacy_functions_are_tools(qwen):
    """functions / function_call become tools / a named tool_choice (nothing generated: the
    request as it would run)."""
    from edgespec.apps.completions import chat_call
    call = chat_call(qwen.engine, ASK, functions=[TOOLS[0]["function"]],
                     function_call={"name": "get_weather"})
    named = chat_call(qwen.engine, ASK, tools=TOOLS, tool_choice=NAMED)
    assert call.turn.choice == named.turn.choice and call.turn.choice.name == "get_weather"
    assert call.params.grammar == named.params.grammar is not None  # the call's schema
    assert call.params.template_vars == named.params.template_vars


def test_tool_refusals(qwen, model_path):
    with pytest.raises(InvalidInputError, match="'get_time', which is not among"):
        qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "get_time"}})
    with pytest.raises(InvalidInputError, match="response_format"):
        qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice="required",
                                    response_format={"type": "json_object"})
    from edgespec.apps import Llama
    # SmolLM2's template renders no tool declarations: refused, naming the model
    with Llama(model_path=str(model_path("smollm2-135m")), n_ctx=256, n_threads=2,
               verbose=False, proposer="none", adaptive=False) as plain:
        with pytest.raises(UnsupportedError, match="smollm2-135m.gguf' has no tool support"):
            plain.create_chat_completion(ASK, tools=TOOLS)
