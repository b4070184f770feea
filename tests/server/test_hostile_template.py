"""A GGUF whose chat template loops, bombs or raises (written by the test: smollm2-135m with
its template replaced) fails that request only, as one clear line: in `edgespec generate`
(exit 1, no traceback, `--chat-template FILE` the way out) and in `edgespec serve` (a JSON
error for the request, /health and the next good request fine)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from gguf_rewrite import kv_string, rewrite
from server_env import MODEL, THREADS

from tools.soak import ServeProcess

# one template, the attack chosen by the last message, so one file and one server cover all
HOSTILE = """{%- macro f() %}{{ f() }}{% endmacro -%}
{%- set c = messages[-1]['content'] -%}
{%- if c == 'loop' -%}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}
{%- elif c == 'bomb' -%}{{ 'x' * 10**10 }}
{%- elif c == 'json' -%}{{ messages|tojson(indent=1000000000) }}
{%- elif c == 'zero' -%}{{ 1 / 0 }}
{%- elif c == 'recurse' -%}{{ f() }}
{%- else -%}<|im_start|>user
{{ c }}<|im_end|>
<|im_start|>assistant
{% endif -%}"""
ATTACKS = ("loop", "bomb", "json", "zero", "recurse")


@pytest.fixture(scope="module")
def hostile_gguf(model_path, tmp_path_factory):
    dst = tmp_path_factory.mktemp("hostile") / "hostile-smol.gguf"
    return rewrite(model_path(MODEL), dst,
                   replace={"tokenizer.chat_template": kv_string("tokenizer.chat_template",
                                                                 HOSTILE)})


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from edgespec.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=180)


def test_generate_names_the_model_and_the_way_out(hostile_gguf, tmp_path):
    base = ["generate", "--target", str(hostile_gguf), "--proposer", "none", "--threads",
            THREADS, "--ctx", "256", "--max-tokens", "2"]
    t0 = time.monotonic()
    r = _cli(*base, "loop")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "hostile-smol.gguf: its chat template" in line and "--chat-template FILE" in line
    assert time.monotonic() - t0 < 60
    # the way out: a template the user trusts
    good = tmp_path / "chatml.jinja"
    good.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                    "{% endfor %}<|im_start|>assistant\n")
    r = _cli(*base, "--chat-template", str(good), "loop")
    assert r.returncode == 0, r.stderr
    # a template file that does not compile is refused before the model loads
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    r = _cli(*base, "--chat-template", str(bad), "hi")
    assert r.returncode == 2 and "bad.jinja: the template does not compile" in r.stderr


def _post(base_url: str, content: str) -> tuple[int, dict]:
    body = json.dumps({"model": "hostile-smol", "max_tokens": 2,
                       "messages": [{"role": "user", "content": content}]}).encode()
    req = urllib.request.Request(base_url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _health(base_url: str) -> tuple[int, float]:
    t0 = time.monotonic()
    with urllib.request.urlopen(base_url + "/health", timeout=10) as resp:
        return resp.status, time.monotonic() - t0


def test_the_server_fails_the_request_only(hostile_gguf):
    with ServeProcess(["--target", str(hostile_gguf), "--proposer", "none", "--ctx", "512",
                       "--threads", THREADS]) as s:
        for attack in ATTACKS:
            t0 = time.monotonic()
            status, body = _post(s.base_url, attack)
            took = time.monotonic() - t0
            assert 400 <= status < 600, (attack, status, body)
            message = body["error"]["message"]
            assert message.startswith("hostile-smol"), (attack, message)  # the model's name
            assert ": its chat template " in message, (attack, message)
            assert "--chat-template FILE" in message and "\n" not in message
            assert took < 10, (attack, took)
            assert _health(s.base_url)[0] == 200
        status, body = _post(s.base_url, "Say hi")
        assert status == 200 and body["choices"][0]["message"]["content"] is not None
        assert s.proc.poll() is None  # still serving
