"""Tool declarations, tool_choice and one turn's setup (edgespec.agents.tools / .turn): the
validation, the template rendering, the forced-call grammar, and reading the output back."""
from __future__ import annotations

import itertools
import json

import pytest

from edgespec.chat import chat
from edgespec.agents import MALFORMED, ToolError, ToolSupportError, parse_choice, parse_tools, \
    prepare_turn, supports_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}}}}

#: a Hermes-style template in the shape of Qwen2.5's (tools in the system turn, calls as
#: <tool_call> JSON with arguments printed by tojson, results as <tool_response>)
HERMES = (
    "{%- if tools %}<|sys|>Tools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "Call as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|assistant|>{{ m.content }}"
    "{%- for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}\n"
    "{%- elif m.role == 'tool' %}<|tool|>{{ m.name }}: {{ m.content }}\n"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and "
    "enable_thinking %}<think>\n{% endif %}{% endif %}")
PLAIN = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"


def call_history():
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": '{"temp_c": 18}'}]


# --- tools and tool_choice --------------------------------------------------------------
def test_tools_parse_and_round_trip():
    tools = parse_tools([WEATHER, TIME])
    assert [t.name for t in tools] == ["get_weather", "get_time"]
    assert tools[0].to_openai() == WEATHER
    no_params = parse_tools([{"type": "function", "function": {"name": "ping"}}])[0]
    assert no_params.parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize("tools,param,code,words", [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
     "tools.0.function.parameters", "invalid_tool_schema", "not a valid JSON Schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"minLength": -1}}}}}],
     "tools.0.function.parameters", "invalid_tool_schema", "/properties/a/minLength"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
     "tools.0.function.parameters", "invalid_tool_schema", "must describe an object"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}],
     "tools.0.function.parameters", "invalid_tool_schema", "JSON Schema object"),
    ([{"type": "retrieval"}], "tools.0", "invalid_type", "function tools are the only kind"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools.0.function.name",
     "invalid_value", "1-64 letters"),
    ([WEATHER, WEATHER], "tools.1.function.name", "invalid_value", "must be unique"),
    ([{"type": "function", "function": {"name": "f", "params": {}}}], "tools.0.function",
     "invalid_value", "unknown field 'params'"),
])
def test_bad_tools_are_refused_naming_the_field(tools, param, code, words):
    with pytest.raises(ToolError, match=words) as e:
        parse_tools(tools)
    assert (e.value.param, e.value.code) == (param, code)


def test_tool_choice():
    tools = parse_tools([WEATHER, TIME])
    assert parse_choice(None, tools).mode == "auto"
    assert parse_choice(None, ()).mode == "none"
    assert parse_choice("required", tools).forced
    named = parse_choice({"type": "function", "function": {"name": "get_time"}}, tools)
    assert (named.mode, named.name, named.forced) == ("named", "get_time", True)
    with pytest.raises(ToolError, match="'get_news', which is not among the declared tools "
                                        "\\('get_weather', 'get_time'\\)") as e:
        parse_choice({"type": "function", "function": {"name": "get_news"}}, tools)
    assert (e.value.param, e.value.code) == ("tool_choice.function.name", "tool_not_found")
    with pytest.raises(ToolError, match="tool_choice needs tools"):
        parse_choice("required", ())
    with pytest.raises(ToolError, match="tool_choice 'always'"):
        parse_choice("always", tools)
    with pytest.raises(ToolError, match="a named tool_choice is"):
        parse_choice({"type": "function", "name": "get_time"}, tools)


# --- rendering ---------------------------------------------------------------------------
def test_the_template_gets_tools_calls_as_objects_and_tool_names():
    turn = prepare_turn(HERMES, "m", call_history(), tools=[WEATHER])
    text = chat.render(HERMES, chat.normalise_messages(turn.messages), extra=turn.template_vars)
    assert json.dumps(WEATHER) in text  # plain JSON (Hugging Face's tojson), not HTML-escaped
    # the history's call printed as the model writes it: arguments an object, not a string
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in text
    assert '<|tool|>get_weather: {"temp_c": 18}' in text
    assert text.endswith("<|assistant|>")


def test_tool_choice_none_hides_the_tools_and_parses_nothing():
    turn = prepare_turn(HERMES, "m", [{"role": "user", "content": "hi"}], tools=[WEATHER],
                        tool_choice="none")
    assert "tools" not in turn.template_vars and turn.call_format is None
    out = turn.output()
    out.feed('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    assert out.finish("eos").finish_reason is None
    assert out.message()["content"].startswith("<tool_call>")


def test_chat_template_kwargs_reach_the_template_and_an_opened_block_is_reasoning():
    msgs = [{"role": "user", "content": "hi"}]
    thinking = prepare_turn(HERMES, "m", msgs, chat_template_kwargs={"enable_thinking": True})
    assert thinking.reasoning_open and thinking.template_vars == {"enable_thinking": True}
    out = thinking.output()
    out.feed("weigh it</think>Hello")
    assert out.finish("eos").finish_reason is None
    assert out.message() == {"role": "assistant", "content": "Hello",
                             "reasoning_content": "weigh it"}
    assert not prepare_turn(HERMES, "m", msgs,
                            chat_template_kwargs={"enable_thinking": False}).reasoning_open
    kept = prepare_turn(HERMES, "m", msgs, reasoning_format="none").output()
    kept.feed("<think>x</think>y")
    assert kept.message()["content"] == "<think>x</think>y"


@pytest.mark.parametrize("kwargs,words", [
    ({"tools": []}, "may not set 'tools'"), ({"add_generation_prompt": False}, "may not set"),
    ({"not a name": 1}, "not a template variable name"), ([1], "must be an object")])
def test_bad_chat_template_kwargs(kwargs, words):
    with pytest.raises(ToolError, match=words):
        prepare_turn(HERMES, "m", [{"role": "user", "content": "hi"}],
                     chat_template_kwargs=kwargs)


def test_a_template_without_tool_support_is_refused_naming_the_model():
    assert supports_tools(HERMES) and not supports_tools(PLAIN)
    with pytest.raises(ToolSupportError, match="the model 'smol' has no tool support"):
        prepare_turn(PLAIN, "smol", [{"role": "user", "content": "hi"}], tools=[WEATHER])
    # a history with calls would lose them in such a template: refused too
    with pytest.raises(ToolSupportError):
        prepare_turn(PLAIN, "smol", call_history())
    with pytest.raises(ToolSupportError):
        prepare_turn(None, "raw", [{"role": "user", "content": "hi"}], tools=[WEATHER])
    assert prepare_turn(PLAIN, "smol", [{"role": "user", "content": "hi"}]).call_format is None


@pytest.mark.parametrize("mutate,param,words", [
    (lambda h: h[2].update(tool_call_id="call_zzz"), "messages.2.tool_call_id",
     "answers no call"),
    (lambda h: h[2].pop("tool_call_id"), "messages.2.tool_call_id", "needs tool_call_id"),
    (lambda h: h[1]["tool_calls"][0]["function"].update(arguments="{city: Paris}"),
     "messages.1.tool_calls.0.function.arguments", "is not JSON"),
    (lambda h: h[1]["tool_calls"][0]["function"].update(arguments="[1]"),
     "messages.1.tool_calls.0.function.arguments", "must be a JSON object"),
    (lambda h: h[1]["tool_calls"][0].pop("id"), "messages.1.tool_calls.0.id", "id is missing"),
    (lambda h: h[0].update(tool_calls=h[1]["tool_calls"]), "messages.0.tool_calls",
     "only assistant messages"),
])
def test_bad_tool_history_is_refused_naming_the_field(mutate, param, words):
    history = call_history()
    mutate(history)
    with pytest.raises(ToolError, match=words) as e:
        prepare_turn(HERMES, "m", history, tools=[WEATHER])
    assert e.value.param == param


# --- forced calls: the grammar -------------------------------------------------------------
def test_a_forced_call_gets_a_grammar_of_the_markup_around_the_schema():
    from edgespec.grammar.constraint import constraint_of
    named = prepare_turn(HERMES, "m", call_history()[:1], tools=[WEATHER, TIME],
                         tool_choice={"type": "function", "function": {"name": "get_time"}},
                         parallel_tool_calls=False)
    g = named.grammar
    assert g.startswith("root ::= tool-call\n") and '"<tool_call>\\n" call-object' in g
    assert '"\\"get_time\\""' in g and "get_weather" not in g  # only the named function
    assert '"\\"UTC\\""' in g  # its parameter schema (the enum) is in the grammar
    constraint_of(grammar=g)  # llama.cpp's parser takes it
    required = prepare_turn(HERMES, "m", call_history()[:1], tools=[WEATHER, TIME],
                            tool_choice="required")
    assert required.grammar.startswith('root ::= tool-call ("\\n" tool-call)*')
    assert "get_weather" in required.grammar and "get_time" in required.grammar
    constraint_of(grammar=required.grammar)
    assert prepare_turn(HERMES, "m", call_history()[:1], tools=[WEATHER]).grammar is None


def test_a_forced_call_refuses_a_schema_the_grammar_cannot_enforce():
    from edgespec.errors import UnsupportedError
    tricky = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}}}
    prepare_turn(HERMES, "m", call_history()[:1], tools=[tricky])  # auto: nothing to enforce
    with pytest.raises(UnsupportedError, match="parameters of 'f' cannot be enforced"):
        prepare_turn(HERMES, "m", call_history()[:1], tools=[tricky], tool_choice="required")


# --- the output read back -----------------------------------------------------------------
def output_of(turn, pieces, stop_reason="eos"):
    counter = itertools.count()
    out = turn.output(new_id=lambda: f"call_{next(counter)}")
    deltas = [d for p in pieces for d in out.feed(p)]
    final = out.finish(stop_reason)
    return out, deltas + final.deltas, final.finish_reason


CALL_TEXT = ('<think>Need the weather.</think>\nChecking.\n<tool_call>\n{"name": "get_weather", '
             '"arguments": {"city": "Paris"}}\n</tool_call>')


def test_stream_deltas_add_up_to_the_message():
    turn = prepare_turn(HERMES, "m", call_history()[:1], tools=[WEATHER])
    whole, _, reason = output_of(turn, [CALL_TEXT])
    assert reason == "tool_calls"
    assert whole.message() == {
        "role": "assistant", "content": "Checking.", "reasoning_content": "Need the weather.",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    out, deltas, reason = output_of(turn, list(CALL_TEXT))  # one character per step
    assert reason == "tool_calls" and out.message() == whole.message()
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    # OpenAI's order: id, type and name first, then the arguments
    assert calls == [{"index": 0, "id": "call_0", "type": "function",
                      "function": {"name": "get_weather", "arguments": ""}},
                     {"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]
    assert not any("<tool_call>" in d.get("content", "") for d in deltas)


def test_finish_reasons():
    turn = prepare_turn(HERMES, "m", call_history()[:1], tools=[WEATHER])
    out, _, reason = output_of(turn, ['<tool_call>{"name": "get_weather", "arguments": '
                                      '{"city": }</tool_call>'])
    assert reason == MALFORMED and out.message()["content"].startswith("<tool_call>")
    assert "tool_calls" not in out.message()
    _, _, reason = output_of(turn, ['<tool_call>{"name": "get_wea'], stop_reason="length")
    assert reason is None  # cut by max_tokens: the engine's "length" says why
    _, _, reason = output_of(turn, ["Just text."])
    assert reason is None


def test_one_call_only_ends_at_the_first_calls_stop_string():
    turn = prepare_turn(HERMES, "m", call_history()[:1], tools=[WEATHER],
                        parallel_tool_calls=False)
    assert turn.stop == ("</tool_call>",)
    # the engine cut the output at the stop string (and removed it): the call is complete
    out, _, reason = output_of(turn, ['<tool_call>\n{"name": "get_weather", "arguments": '
                                      '{"city": "Oslo"}}\n'], stop_reason="stop")
    assert reason == "tool_calls"
    assert out.message()["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_render_offers_what_hugging_face_templates_use():
    # loop controls, today's date (Llama 3.x prints it) and plain-JSON tojson with its options
    tmpl = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}"
            "{% endfor %}|{{ strftime_now('%Y') | length }}|{{ tools | tojson(indent=1) }}")
    text = chat.render(tmpl, [{"role": "user", "content": "<a&b>"}, {"role": "user", "content": "x"}],
                       tools=[{"k": "é<"}])
    assert text == '<a&b>|4|[\n {\n  "k": "é<"\n }\n]'
