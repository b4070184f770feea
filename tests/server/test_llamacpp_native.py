"""llama-server's native endpoints (edgespec.server.dialects.llamacpp*): bodies parsed and
answers shaped, on literal values; then httpx against a real `edgespec serve` (smollm2-135m,
qwen-0.5b beside it for /infill), as llama.vscode, llama.vim and the llama.cpp web UI call
them."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
from server_env import COUNTING, FIM_MODEL, MODEL

from edgespec.api.events import TokenLogprob
from edgespec.api.stats import RequestStats
from edgespec.protocol.errors import ProtocolError
from edgespec.protocol.events import ChoiceDone
from edgespec.server.dialects import llamacpp_wire as lw

#: the fields of llama-server's /completion answer (server-task.cpp, to_json_non_oaicompat)
COMPLETION_FIELDS = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
                     "tokens_evaluated", "generation_settings", "prompt", "has_new_line",
                     "truncated", "stop_type", "stopping_word", "tokens_cached", "timings"}
TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
           "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second",
           "draft_n", "draft_n_accepted", "proposer"}


def refused(fn, body) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        fn(body, 256)
    return e.value


# --- parsing ---------------------------------------------------------------------------------
def test_completion_fields_with_llama_server_defaults():
    c = lw.parse_completion({"prompt": "Hi", "n_predict": 8, "stop": ["\n"], "seed": 3,
                             "n_probs": 2, "cache_prompt": True, "id_slot": -1,
                             "samplers": ["top_k"], "logit_bias": [[5, False], [7, 1.5]],
                             "return_tokens": True, "stream": True}, 256)
    p = c.core.params
    assert (c.core.prompt, p.max_tokens, p.stop, p.logprobs, p.chat) == ("Hi", 8, ("\n",), 2,
                                                                         False)
    assert p.sampling.logit_bias == ((5, -100.0), (7, 1.5)) and p.sampling.seed == 3
    assert c.stream and c.return_tokens and c.n_probs == 2
    d = lw.parse_completion({"prompt": [1, 2, 3]}, 256)
    assert d.core.prompt == (1, 2, 3) and d.core.params.max_tokens == 256  # -1: the limit
    s = d.core.params.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.8, 40, 0.95, 0.05, None)
    assert lw.parse_completion({"prompt": ["only one"]}, 256).core.prompt == "only one"
    assert lw.parse_completion({"prompt": "x", "json_schema": {"type": "object"}},
                               256).core.params.json_schema == {"type": "object"}


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, "b"]}, "prompt"),
    ({"prompt": "x", "n_predict": 0}, "n_predict"),
    ({"prompt": "x", "n_predict": 100000}, "n_predict"),
    ({"prompt": "x", "mirostat": 2}, "mirostat"),
    ({"prompt": "x", "ignore_eos": True}, "ignore_eos"),
    ({"prompt": "x", "logit_bias": [["Hello", -1]]}, "logit_bias"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "stop": "\n"}, "stop"),
    ({"prompt": "x", "lora": [{"id": 0, "scale": 1}]}, "lora"),
])
def test_bad_completion_bodies_are_refused_naming_the_field(body, param):
    err = refused(lw.parse_completion, body)
    assert err.status == 400 and err.param == param, err


def test_infill_fields():
    c = lw.parse_infill({"input_prefix": "def f(", "input_suffix": "\n", "prompt": "x",
                         "input_extra": [{"filename": "a.py", "text": "A = 1"}, {"text": "B"}],
                         "n_predict": 4}, 256)
    assert c.core.fim.extra == (("a.py", "A = 1"), ("tmp", "B")) and c.middle == "x"
    assert refused(lw.parse_infill, {"input_suffix": ""}).param == "input_prefix"
    assert refused(lw.parse_infill, {"input_prefix": "", "input_suffix": "",
                                     "input_extra": [{"filename": "a"}]}).param == \
        "input_extra.0.text"
    t = lw.as_token_prompt(c, lw.infill_tokens([9, 8], [7]))
    assert t.core.prompt == (9, 8, 7) and t.core.fim is None


# --- rendering -------------------------------------------------------------------------------
def _done(stop_reason="length", text="a\nb", tokens=(5, 6)):
    return ChoiceDone(0, "length", stop_reason, text, None, (), 4, len(tokens),
                      {"predicted_n": len(tokens)}, RequestStats(), tokens=tokens,
                      logprobs=(TokenLogprob(5, -0.1, ((5, -0.1), (9, -2.0))),))


def test_the_answer_has_llama_server_fields():
    c = lw.parse_completion({"prompt": "p", "n_probs": 1, "return_tokens": True}, 16)
    settings = lw.generation_settings(c.core.params, c)
    shape = lw.Shape(c, "m", "p", settings, 4, piece=lambda t: b"x")
    body = shape.final(_done(), whole=True)
    assert set(body) == COMPLETION_FIELDS | {"completion_probabilities"}
    assert (body["stop_type"], body["tokens"], body["has_new_line"]) == ("limit", [5, 6], True)
    assert body["completion_probabilities"][0]["top_logprobs"][1]["id"] == 9
    assert lw.stop_type(_done("eos")) == "eos" and lw.stop_type(_done("stop")) == "word"
    assert lw.project(body, ("content", "generation_settings/n_predict", "nope")) == {
        "content": "a\nb", "generation_settings/n_predict": -1}
    assert "stop" not in lw.generation_settings(c.core.params, c, metrics_only=True)
    chunk = shape.chunk("a", 2)
    assert (chunk["stop"], chunk["tokens_predicted"], chunk["tokens_evaluated"]) == (False, 2, 4)


def test_errors_are_llama_server_shaped():
    err = ProtocolError(400, "bad", param="x")
    assert lw.error_body(err) == {"error": {"code": 400, "message": "bad",
                                            "type": "invalid_request_error"}}
    assert lw.error_body(ProtocolError(501, "no", kind="unsupported"))["error"]["type"] == \
        "not_supported_error"


def test_token_pieces_keep_partial_bytes_as_bytes():
    pieces = {1: b"Hi", 2: b"\xc3"}
    assert lw.token_pieces([1, 2], pieces.__getitem__) == [{"id": 1, "piece": "Hi"},
                                                            {"id": 2, "piece": [195]}]


# --- a real server ---------------------------------------------------------------------------
@pytest.fixture
def http(dialect_server):
    with httpx.Client(base_url=dialect_server.base_url, timeout=180) as c:
        yield c


def test_completion_whole_streamed_and_by_token_ids_agree(http):
    body = {"prompt": COUNTING, "n_predict": 12, "temperature": 0, "return_tokens": True}
    whole = http.post("/completion", json=body).json()
    assert set(whole) == COMPLETION_FIELDS, set(whole) ^ COMPLETION_FIELDS
    assert whole["stop"] is True and whole["stop_type"] == "limit"
    assert whole["tokens_predicted"] == 12 == len(whole["tokens"])
    assert set(whole["timings"]) >= TIMINGS - {"draft_n", "draft_n_accepted"}
    assert whole["timings"]["predicted_n"] == 12 and whole["content"].startswith(" 11")
    text = http.post("/detokenize", json={"tokens": whole["tokens"]}).json()["content"]
    assert text == whole["content"]
    lines = []
    with http.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [json.loads(l[len("data: "):]) for l in r.iter_lines() if l.startswith("data: ")]
    assert lines[-1]["stop"] is True and all(not l["stop"] for l in lines[:-1])
    assert "".join(l["content"] for l in lines) == whole["content"]
    assert lines[-2]["tokens_predicted"] == 12
    ids = http.post("/tokenize", json={"content": COUNTING, "add_special": True}).json()["tokens"]
    by_ids = http.post("/completion", json={**body, "prompt": ids}).json()
    assert by_ids["content"] == whole["content"]


def test_tokenize_detokenize_and_apply_template(http):
    r = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    assert "".join(t["piece"] for t in r["tokens"]) == "Hello world"
    ids = [t["id"] for t in r["tokens"]]
    assert http.post("/tokenize", json={"content": "Hello world"}).json() == {"tokens": ids}
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"content": "Hello world"}
    prompt = http.post("/apply-template", json={"messages": [
        {"role": "user", "content": "Say hi"}]}).json()["prompt"]
    assert "Say hi" in prompt and prompt.rstrip().endswith("assistant")


def test_props_slots_and_health(http, dialect_server):
    props = http.get("/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 1024
    assert props["model_alias"] == MODEL and props["chat_template"]
    assert props["edgespec"]["proposer"] == "ngram+suffix"
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)
    assert http.get("/v1/health").json()["status"] == "ok"
    # a long request occupies a slot while it runs
    started = threading.Event()

    def long_request():
        with httpx.Client(base_url=dialect_server.base_url, timeout=180) as c:
            with c.stream("POST", "/completion", json={"prompt": COUNTING, "n_predict": 200,
                                                       "temperature": 0, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        started.set()
                        break  # leaving cancels the request

    t = threading.Thread(target=long_request)
    t.start()
    assert started.wait(120)
    busy = [s for s in http.get("/slots").json() if s["is_processing"]]
    t.join(60)
    if busy:  # unless it ended in between
        assert busy[0]["params"]["n_predict"] == 200 and busy[0]["next_token"][0]["n_decoded"] > 0
    assert dialect_server.wait_idle(20)["running"] == 0


def test_infill_on_a_fim_model_and_the_refusal_elsewhere(http):
    body = {"model": FIM_MODEL, "input_prefix": "def add(a, b):\n    ",
            "input_suffix": "\n\nprint(add(1, 2))\n", "n_predict": 12, "temperature": 0}
    r = http.post("/infill", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert "return" in out["content"] and "<|fim_middle|>" in out["prompt"]
    extra = http.post("/infill", json={**body, "input_extra": [
        {"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]}).json()
    assert "<|file_sep|>util.py" in extra["prompt"] and extra["content"]
    middle = http.post("/infill", json={**body, "prompt": "return"}).json()
    assert middle["prompt"].endswith("<|fim_middle|>return") and middle["content"]
    no_fim = http.post("/infill", json={**body, "model": MODEL})
    assert no_fim.status_code == 501
    assert MODEL in no_fim.json()["error"]["message"]
    assert no_fim.json()["error"]["type"] == "not_supported_error"


def test_bad_input_is_llama_server_shaped(http):
    for path, body, status in [("/completion", {"prompt": "x", "n_predict": 0}, 400),
                               ("/completion", {"prompt": "x", "mirostat": 1}, 400),
                               ("/completion", {"prompt": "x", "model": "nope"}, 404),
                               ("/detokenize", {"tokens": [10 ** 9]}, 400),
                               ("/tokenize", {"content": 5}, 400),
                               ("/apply-template", {"messages": "hi"}, 400)]:
        r = http.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
        err = r.json()["error"]
        assert set(err) == {"code", "message", "type"} and err["code"] == status
    r = http.post("/completion", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_v1_health_is_open_like_health_and_the_rest_needs_the_key(keyed_server):
    with httpx.Client(base_url=keyed_server.base_url, timeout=60) as c:
        r = c.get("/v1/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        assert c.post("/tokenize", json={"content": "hi"}).status_code == 401
        assert c.get("/props").status_code == 401
