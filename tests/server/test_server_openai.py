"""The openai client against a real `edgespec serve` (smollm2-135m, exact mode)."""
from __future__ import annotations

import json
import re
import threading

import jsonschema
import openai
import pytest

from server_env import COUNTING, MODEL

GREEDY = {"temperature": 0.0}


def chat(client, content, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def collect_stream(stream):
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_chat_whole_and_streamed_agree_with_usage_and_stats(client, server):
    whole = chat(client, "Name three colours.", max_tokens=24, **GREEDY)
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = whole.usage
    assert u.completion_tokens >= 1 and u.prompt_tokens > 5
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    ext = whole.model_extra["edgespec"]
    assert ext["proposer"] == "ngram+suffix"
    assert ext["accepted"] <= ext["drafted"]
    assert sum(int(k) * v for k, v in ext["accepted_length_hist"].items()) >= u.completion_tokens
    assert re.fullmatch(r"[0-9a-f]{64}", ext["identity"])
    assert whole.system_fingerprint == ext["identity"][:12]

    chunks, text = collect_stream(chat(client, "Name three colours.", max_tokens=24, stream=True,
                                       stream_options={"include_usage": True}, **GREEDY))
    assert text == choice.message.content  # exact mode: greedy is deterministic
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == choice.finish_reason
    assert finish[0].model_extra["edgespec"]["stop_reason"] == ext["stop_reason"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_whole_and_streamed(client):
    whole = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=12, **GREEDY)
    assert whole.choices[0].text.startswith(" 11")
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    chunks = list(client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=12,
                                            stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["edgespec"]["stop_reason"] == "length"


def test_stop_strings_cut_the_output(client):
    full = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=16, **GREEDY)
    text = full.choices[0].text
    assert " 13," in text
    for stop in (" 13,", [" 13,", "never-there"]):
        cut = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=16, stop=stop,
                                        **GREEDY)
        assert cut.choices[0].text == text[:text.index(" 13,")]
        assert cut.choices[0].finish_reason == "stop"
        assert cut.model_extra["edgespec"]["stop_reason"] == "stop"
    streamed = list(client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=16,
                                              stop=" 13,", stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in streamed) == text[:text.index(" 13,")]


def test_seed_reproduces_a_sampled_answer(client):
    def sample(seed):
        return chat(client, "Write one sentence about the sea.", max_tokens=24,
                    temperature=1.0, seed=seed).choices[0].message.content
    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(s) != first for s in (1, 2, 3))  # the seed, not greedy, decides


def test_logprobs_in_both_shapes(client):
    r = chat(client, "Say hello.", max_tokens=8, logprobs=True, top_logprobs=2, **GREEDY)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0.0 and len(t.top_logprobs) == 2
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
        # greedy: the chosen token is the most likely one
        assert t.logprob >= max(a.logprob for a in t.top_logprobs) - 1e-6

    c = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=6, logprobs=3,
                                  **GREEDY)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text
    assert len(lp.token_logprobs) == 6 and all(len(t) <= 3 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_response_format_json_object_and_schema(client):
    r = chat(client, "Give me a JSON object describing a cat with keys name and age.",
             max_tokens=200, response_format={"type": "json_object"}, **GREEDY)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = chat(client, "Describe Alice, who is 30, as JSON.", max_tokens=200,
             response_format={"type": "json_schema",
                              "json_schema": {"name": "person", "schema": schema}}, **GREEDY)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_concurrent_clients_equal_their_requests_alone(client, server):
    """--exact --parallel 4: four clients at once (their sequences batched in one pass)
    each get exactly what their request gets alone."""
    prompts = ["Name three colours.", "What is 2 + 2?", "Write a haiku about rain.",
               "List two fruits."]
    alone = [chat(client, p, max_tokens=24, **GREEDY).choices[0].message.content
             for p in prompts]
    together = [None] * 4
    errors = []

    def run(i):
        try:
            together[i] = chat(client, prompts[i], max_tokens=24, **GREEDY).choices[0] \
                .message.content
        except Exception as e:  # reported below, with the others' results
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    running = 0
    while any(t.is_alive() for t in threads):
        running = max(running, server.health()["running"])
    for t in threads:
        t.join(120)
    assert not errors
    assert running >= 2, "they never ran together"
    assert together == alone, f"together: {together}\nalone: {alone}"


def test_models_lists_exactly_the_served_model_with_its_identity(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]  # nothing it could not serve
    loaded = [m for m in models if m.model_extra.get("loaded")]
    assert [m.id for m in loaded] == [MODEL] and loaded[0].model_extra["state"] == "loaded"
    ident = loaded[0].model_extra["identity"]
    record = loaded[0].model_extra["edgespec"]["identity_record"]
    assert record["hash"] == ident and record["components"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("qwen-1.5b")  # registered, but not served by this server
    assert client.models.retrieve(MODEL).id == MODEL
    r = chat(client, "Hi", max_tokens=2, **GREEDY)
    assert r.model_extra["edgespec"]["identity"] == ident


def test_metrics_count_what_was_served(client, server):
    def scrape():
        status, headers, body = server.request("GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        return body.decode()

    def value(text, name):
        m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    before = scrape()
    r = client.completions.create(model=MODEL, prompt=COUNTING * 3, max_tokens=20, **GREEDY)
    after = scrape()
    assert value(after, "edgespec_generation_tokens_total") - \
        value(before, "edgespec_generation_tokens_total") == r.usage.completion_tokens
    assert value(after, 'edgespec_requests_finished_total{stop_reason="length"}') == \
        value(before, 'edgespec_requests_finished_total{stop_reason="length"}') + 1
    assert value(after, "edgespec_time_to_first_token_seconds_count") == \
        value(before, "edgespec_time_to_first_token_seconds_count") + 1
    drafted = r.model_extra["edgespec"]["drafted"]
    assert value(after, "edgespec_spec_decode_num_draft_tokens_total") - \
        value(before, "edgespec_spec_decode_num_draft_tokens_total") == drafted
    for name in ("edgespec_spec_decode_num_drafts_total",
                 "edgespec_spec_decode_num_accepted_tokens_total",
                 "edgespec_inter_token_latency_seconds_count", "edgespec_num_requests_waiting",
                 "edgespec_num_requests_running"):
        assert re.search(rf"^{name} ", after, re.M), name
    ident = r.model_extra["edgespec"]["identity"]
    assert f'identity="{ident}"' in after  # edgespec_build_info


@pytest.mark.parametrize("body,status,code,param", [
    (b'{"model": "smollm2-135m", "messages": [', 400, "invalid_json", None),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
     400, "invalid_encoding", None),
    (b'[1, 2]', 400, "invalid_type", None),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"},
     400, "invalid_type", "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3},
     400, "invalid_value", "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 7}]}, 400, "invalid_type",
     "messages.0.content"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404,
     "model_not_found", "model"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 13}, 400,
     "invalid_value", "n"),  # beyond --parallel 4 + --max-queue 8 (n = 2 is served)
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f"}}]}, 400, "tools_unsupported",
     "tools"),  # SmolLM2's template has no place for tools
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 513},
     400, "invalid_value", "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": [""]}, 400,
     "invalid_value", "stop"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 1500}]}, 400,
     "context_length_exceeded", "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x" * (1 << 20)}]}, 413,
     "request_too_large", None),
])
def test_bad_requests_get_openai_shaped_errors_and_the_server_keeps_serving(
        server, client, body, status, code, param):
    got, _, raw = server.request("POST", "/v1/chat/completions", body)
    err = json.loads(raw)["error"]
    assert got == status, err
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    assert err["param"] == param
    assert chat(client, "Hi", max_tokens=2, **GREEDY).choices[0].message.content is not None


def test_openai_client_raises_its_own_error_classes(client):
    import openai
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "hi", n=13)
    assert e.value.code == "invalid_value" and e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="word " * 1500, max_tokens=4)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"


def test_traffic_slice_header_is_checked(server, client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "temperature": 0.0}
    status, _, raw = server.request("POST", "/v1/chat/completions", body,
                                    {"X-Edgespec-Slice": "bad slice!"})
    assert status == 400 and json.loads(raw)["error"]["param"] == "x-edgespec-slice"
    status, _, raw = server.request("POST", "/v1/chat/completions", body,
                                    {"X-Edgespec-Slice": "code-review"})
    assert status == 200, raw


def test_unknown_fields_are_ignored_by_default(client):
    """Fields of newer API versions (and anything else) do not trip the server up."""
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        temperature=0.0, user="u1", metadata={"a": "b"}, store=False, service_tier="auto",
        extra_body={"mirostat": 2, "brand_new_field": {"x": 1}})
    assert r.choices[0].message.content is not None
