"""OpenAI breadth (issue #38 part 6) with the real openai client on a real `edgespec serve`
(smollm2-135m, default --parallel 1, the free proposers): n choices, token-id prompts,
lists of prompts, echo, suffix (FIM: refused on smollm2, served on Qwen2.5-Coder 0.5B),
message names, both max-token fields, the CORS preflight, routes without /v1, llama-server's
timings and the per-token origins extension."""
from __future__ import annotations

import httpx
import openai
import pytest
from server_env import COUNTING, MODEL, base_args

from tools.soak import ServeProcess

GREEDY = {"temperature": 0.0}
TIMINGS = {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
           "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "draft_n",
           "draft_n_accepted"}


@pytest.fixture(scope="module")
def plain_server(model_path):
    """Default sequences (--parallel 1), as a new user starts it."""
    model_path(MODEL)
    with ServeProcess(base_args("--threads", "1", "--proposer", "ngram+suffix",
                                "--max-tokens-limit", "128")) as s:
        yield s


@pytest.fixture(scope="module")
def oc(plain_server):
    with openai.OpenAI(base_url=plain_server.base_url + "/v1", api_key="unused",
                       max_retries=0, timeout=180) as c:
        yield c


def test_n_two_greedy_and_sampled_on_default_sequences(oc):
    r = oc.chat.completions.create(model=MODEL, n=2, max_tokens=6, messages=[
        {"role": "user", "content": "Say hi."}], **GREEDY)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content
    assert len(r.model_extra["edgespec"]["choices"]) == 2
    s = oc.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=6,
                              temperature=1.0, seed=7)
    assert sorted(c.index for c in s.choices) == [0, 1]
    assert s.usage.completion_tokens == 12


def test_token_prompts_lists_of_prompts_and_echo(oc, model_path):
    from edgespec.runtime.model import load_model
    ids = load_model(model_path(MODEL)).tokenize(COUNTING, add_special=False)
    by_text = oc.completions.create(model=MODEL, prompt=COUNTING, max_tokens=6, **GREEDY)
    by_ids = oc.completions.create(model=MODEL, prompt=ids, max_tokens=6, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    many = oc.completions.create(model=MODEL, prompt=[COUNTING, "A, B, C, D,"], max_tokens=6,
                                 **GREEDY)
    assert [c.index for c in many.choices] == [0, 1]
    assert many.choices[0].text == by_text.choices[0].text
    assert many.choices[1].text != many.choices[0].text
    echo = oc.completions.create(model=MODEL, prompt=COUNTING, max_tokens=6, echo=True,
                                 **GREEDY)
    assert echo.choices[0].text == COUNTING + by_text.choices[0].text


def test_suffix_is_refused_naming_a_model_without_fim_tokens(oc):
    with pytest.raises(openai.BadRequestError) as e:
        oc.completions.create(model=MODEL, prompt="def f(", suffix="\n", max_tokens=4)
    assert e.value.code == "fim_unsupported" and MODEL in str(e.value)


def test_names_and_both_max_token_fields(oc):
    r = oc.chat.completions.create(model=MODEL, max_tokens=50, max_completion_tokens=3,
                                   messages=[{"role": "user", "name": "bob",
                                              "content": "Count to ten."}], **GREEDY)
    assert r.usage.completion_tokens <= 3  # max_completion_tokens wins
    assert r.choices[0].finish_reason in ("length", "stop")


def test_preflight_routes_without_v1_and_the_default_model(plain_server):
    base = plain_server.base_url
    pre = httpx.options(base + "/v1/chat/completions", headers={
        "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204 and "access-control-allow-origin" not in pre.headers
    assert httpx.get(base + "/models").json()["data"][0]["id"] == MODEL
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}  # no model
    chat = httpx.post(base + "/chat/completions", json=body, timeout=120).json()
    assert chat["model"] == MODEL and chat["choices"][0]["message"]["role"] == "assistant"
    comp = httpx.post(base + "/completions", json={"prompt": COUNTING, "max_tokens": 3},
                      timeout=120).json()
    assert comp["choices"][0]["text"] and comp["usage"]["completion_tokens"] == 3
    missing = httpx.post(base + "/v1/chat/completions", json={**body, "model": "gpt-4o-mini"})
    assert missing.status_code == 404  # --model-alias-any is off by default


def test_timings_whole_and_on_the_last_stream_chunk(oc):
    r = oc.completions.create(model=MODEL, prompt=COUNTING, max_tokens=12, **GREEDY)
    t = r.model_extra["timings"]
    assert TIMINGS <= set(t) and t["predicted_n"] == 12 and t["prompt_n"] >= 1
    assert t["predicted_ms"] > 0 and t["predicted_per_second"] > 0
    assert t["draft_n_accepted"] <= t["draft_n"] and t["proposer"] == "ngram+suffix"
    chunks = list(oc.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
        **GREEDY))
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert TIMINGS <= set(last.model_extra["timings"])
    assert all("timings" not in (c.model_extra or {}) for c in chunks[:-1]
               if c is not last)


def test_origins_extension_only_when_asked(oc):
    messages = [{"role": "user", "content": "Repeat exactly: " + COUNTING * 3}]
    chunks = list(oc.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, stream=True,
        stream_options={"include_origins": True}, **GREEDY))
    tokens = [t for c in chunks if c.choices and not c.choices[0].finish_reason
              for t in (c.model_extra.get("edgespec") or {}).get("tokens", [])]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert tokens and "".join(t["text"] for t in tokens) == text
    assert {t["origin"] for t in tokens} <= {"target", "ngram", "suffix"}
    assert all(set(t) == {"text", "origin", "drafted", "position"} for t in tokens)
    plain = list(oc.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                            stream=True, **GREEDY))
    assert all("edgespec" not in (c.model_extra or {}) for c in plain
               if c.choices and not c.choices[0].finish_reason)


@pytest.mark.slow
def test_suffix_fills_the_middle_on_a_coder_model(model_path):
    """Qwen2.5-Coder 0.5B has FIM tokens: the completion fills the gap."""
    model_path("qwen-0.5b")
    with ServeProcess(["--target", "qwen-0.5b", "--ctx", "512", "--threads", "2",
                       "--proposer", "none", "--max-tokens-limit", "32"]) as s:
        with openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0,
                           timeout=300) as c:
            r = c.completions.create(model="qwen-0.5b", prompt="def add(a, b):\n    return ",
                                     suffix="\n\nprint(add(1, 2))\n", max_tokens=8, **GREEDY)
    text = r.choices[0].text
    assert "a" in text and "b" in text and "+" in text, text
