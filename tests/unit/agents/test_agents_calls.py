"""Tool-call markup -> OpenAI tool_calls, for each format, fed whole and in every piecing."""
from __future__ import annotations

import itertools
import json
import random

import pytest

from edgespec.agents.calls import CallParser, detect_format

NAMES = ("get_weather", "get_time")


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(pieces, fmt="hermes", names=NAMES, parallel=True):
    p = CallParser(fmt, names, parallel, new_id=ids())
    got = [p.feed(x) for x in pieces] + [p.finish()]
    content = "".join(g.content for g in got)
    calls = [(c.name, json.loads(c.arguments)) for g in got for c in g.calls]
    assert [(c.name, json.loads(c.arguments)) for c in p.calls] == calls
    assert [c.index for c in p.calls] == list(range(len(p.calls)))
    return content, calls, p.malformed


def piecings(text, n=25, seed=0):
    """The whole text, one character at a time, and random cuts."""
    yield [text]
    yield list(text)
    rng = random.Random(seed)
    for _ in range(n):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 8))))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


PARIS = ("get_weather", {"city": "Paris"})
CASES = [
    # (format, text, content, calls, malformed)
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "", [PARIS], False),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
               '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n'
               '</tool_call>', "Let me look.", [PARIS, ("get_time", {"tz": "CET"})], False),
    # ended by the end-of-turn token without the closing tag: still a call
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "",
     [PARIS], False),
    # arguments as a JSON string (some fine-tunes write them so)
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'
               '</tool_call>', "", [PARIS], False),
    ("hermes", "No tools needed: 2 + 2 = 4.", "No tools needed: 2 + 2 = 4.", [], False),
    ("hermes", "a < b, and <tool is not a tag", "a < b, and <tool is not a tag", [], False),
    # malformed: the markup is returned as content, unchanged
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>', [], True),
    ("hermes", '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>', [], True),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', [], True),
    ("hermes", '<tool_call>\n{"name": "get_weather", "argu', '<tool_call>\n{"name": "get_weather", "argu',
     [], True),
    # Qwen2.5-Coder's habit: the call object in a fenced json block, or bare
    ("hermes", '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n'
               '  }\n}\n```', "", [PARIS], False),
    ("hermes", 'Calling it:\n```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
     "Calling it:", [PARIS], False),
    ("hermes", '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS],
     False),
    ("hermes", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS], False),
    # ... but code blocks and JSON answers that are no call stay content, not malformed
    ("hermes", 'Here:\n```json\n{"name": "Bob", "age": 3}\n```\nDone.',
     'Here:\n```json\n{"name": "Bob", "age": 3}\n```\nDone.', [], False),
    ("hermes", '```json\n{"name": "get_weather"}\n```', '```json\n{"name": "get_weather"}\n```',
     [], False),
    ("hermes", "```python\nprint(`x`)\n```", "```python\nprint(`x`)\n```", [], False),
    ("hermes", '{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', [], False),
    ("hermes", 'x = {"name": "get_weather", "arguments": {}}', 'x = {"name": "get_weather", '
               '"arguments": {}}', [], False),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS], False),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     [PARIS], False),
    # a JSON answer that names no tool is an answer
    ("llama3", '{"city": "Paris", "temp": 18}', '{"city": "Paris", "temp": 18}', [], False),
    ("llama3", 'It is {"warm": true} there.', 'It is {"warm": true} there.', [], False),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                '"id": "abc123def"}]', "", [PARIS], False),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [PARIS], False),
    ("mistral", '[TOOL_CALLS][{"name": "nope", "arguments": {}}]',
     '[TOOL_CALLS][{"name": "nope", "arguments": {}}]', [], True),
]


@pytest.mark.parametrize("fmt,text,content,calls,malformed", CASES)
def test_parse_in_every_piecing(fmt, text, content, calls, malformed):
    for pieces in piecings(text, seed=len(text)):
        assert parse(pieces, fmt) == (content, calls, malformed), pieces


def test_a_call_is_released_whole_when_its_markup_closes():
    p = CallParser("hermes", NAMES, new_id=ids())
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    cut = text.index("</tool_call>") + 5
    first = p.feed(text[:cut])
    assert first.content == "Sure." and first.calls == []  # the open call is held
    second = p.feed(text[cut:])
    assert [c.name for c in second.calls] == ["get_weather"]
    assert second.calls[0].id == "call_0" and json.loads(second.calls[0].arguments) == PARIS[1]


def test_content_is_released_as_soon_as_it_cannot_be_markup():
    p = CallParser("hermes", NAMES)
    assert p.feed("The answer <to").content == "The answer"  # "<to" may open a call
    assert p.feed("day>").content == " <today>"


def test_one_call_only_leaves_later_markup_as_content():
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    content, calls, malformed = parse([text], parallel=False)
    assert calls == [PARIS] and not malformed
    assert content == '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


def test_any_name_when_no_tools_are_listed():
    assert parse(['<tool_call>{"name": "x", "arguments": {}}</tool_call>'], names=None)[1] == \
        [("x", {})]


def test_format_detection_from_the_template():
    assert detect_format("{{- '<tool_call>\\n' }}") == "hermes"
    assert detect_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_format("{{- '<|python_tag|>' }}{% if m.role == 'ipython' %}") == "llama3"
    assert detect_format("{% for tool in tools %}{{ tool | tojson }}{% endfor %}") == "hermes"
    with pytest.raises(ValueError, match="unknown tool-call format"):
        CallParser("xml")
