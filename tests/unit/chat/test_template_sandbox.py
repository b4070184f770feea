"""Chat templates are code from downloaded files: each hostile one (a loop, a bomb, a raise, a
huge file) ends quickly as one ChatTemplateError line naming the model and --chat-template
FILE, real templates render as before, and a template's own refusal stays a 400-class error."""
from __future__ import annotations

import threading
import time

import pytest

from edgespec.chat import chat, sandbox
from edgespec.chat.sandbox import ChatTemplateError
from edgespec.errors import InvalidInputError

MSGS = [{"role": "user", "content": "hi"}]

HOSTILE = {
    "nested range loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                         "{% endfor %}",
    "loop writing": "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}"
                    "{% endfor %}",
    "exponential macro": "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}"
                         "{% endmacro %}{{ f(60) }}",
    "string bomb": "{{ 'x' * 10**10 }}",
    "list bomb": "{{ ([1] * 10**9)|length }}",
    "doubling ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                  "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "doubling macro": "{% macro f(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s='x') %}"
                      "{% for i in range(64) %}{% set ns.s = f(ns.s) %}{% endfor %}",
    "tojson indent bomb": "{{ messages|tojson(indent=1000000000) }}",
    "printf width bomb": "{{ '%0999999999d' % 1 }}",
    "format filter bomb": "{{ '%0999999999d'|format(1) }}",
    "str.format bomb": "{{ '{:>999999999}'.format(1) }}",
    "center bomb": "{{ 'x'|center(999999999) }}",
    "replace bomb": "{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}",
    "join bomb": "{% set s = 'a' * 100000 %}{{ s.join(s|list) }}",
    "indent bomb": "{% set s = '\\n' * 1000000 %}{{ s|indent(9000) }}",
    "batch bomb": "{{ [1]|batch(1000000000, 0)|list }}",
    "power bomb": "{{ 10 ** 100000000 }}",
    "quadratic sum": "{{ ([[1] * 8000] * 8000)|sum(start=[])|length }}",
    "big output": "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s }}{% endfor %}",
    "ZeroDivisionError": "{{ 1 / 0 }}",
    "TypeError": "{{ 1 + 'a' }}",
    "IndexError": "{{ '{}{}'.format(1) }}",
    "RecursionError": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "syntax error": "{% for %}",
    "deep nesting": "{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}",
    "64 MiB template": "x" * (64 << 20),
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_template_is_one_clear_line_within_two_seconds(name):
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError) as e:
        chat.render(HOSTILE[name], MSGS, model="evil.gguf")
    took = time.monotonic() - t0
    msg = str(e.value)
    assert msg.startswith("evil.gguf: its chat template ") and "--chat-template FILE" in msg
    assert "\n" not in msg and len(msg) < 400
    assert took < 3.0, f"{name} took {took:.1f} s"


def test_the_budget_is_per_render_and_threads_do_not_share_it():
    """A hostile render on one thread does not starve a good one on another, and a good
    render after a failed one starts with a full budget."""
    results: dict[str, object] = {}

    def run(key, template):
        try:
            results[key] = chat.render(template, MSGS)
        except ChatTemplateError as e:
            results[key] = e

    bad = threading.Thread(target=run, args=("bad", HOSTILE["loop writing"]))
    bad.start()
    for i in range(20):
        run(f"good{i}", "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}")
    bad.join()
    assert isinstance(results["bad"], ChatTemplateError)
    assert all(results[f"good{i}"] == "user:hi" for i in range(20))


def test_real_templates_render_as_before(model_path):
    """The registry models' own templates (read from their GGUF headers), tools included."""
    from edgespec.runtime.gguf_header import read_gguf_header

    for name in ("smollm2-135m", "qwen-0.5b"):
        template = read_gguf_header(model_path(name)).metadata["tokenizer.chat_template"]
        text = chat.render(template, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "hello"},
                                      {"role": "user", "content": "and?"}])
        assert "Be brief." in text and "and?" in text and text.count("hello") == 1
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    text = chat.render(template, MSGS, tools=tools)
    assert '"name": "get_weather"' in text


def test_a_long_legitimate_conversation_fits_the_bounds():
    template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 200}
            for i in range(2000)]
    assert chat.render(template, msgs).count("<|user|>") == 1000


def test_raise_exception_stays_the_requests_fault():
    with pytest.raises(InvalidInputError) as e:
        chat.render("{{ raise_exception('Conversation roles must alternate') }}", MSGS)
    assert not isinstance(e.value, ChatTemplateError)
    assert "refused the conversation: Conversation roles must alternate" in str(e.value)


def test_template_files_are_checked_before_use(tmp_path):
    good = tmp_path / "good.jinja"
    good.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert sandbox.read_template_file(good).startswith("{% for")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    with pytest.raises(InvalidInputError, match="bad.jinja: the template does not compile"):
        sandbox.read_template_file(bad)
    latin = tmp_path / "latin.jinja"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        sandbox.read_template_file(latin)
    huge = tmp_path / "huge.jinja"
    huge.write_bytes(b"x" * (4 * sandbox.MAX_TEMPLATE_CHARS + 1))
    with pytest.raises(InvalidInputError, match="too large"):
        sandbox.read_template_file(huge)
