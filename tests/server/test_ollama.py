"""Ollama's native API (edgespec.server.dialects.ollama*): bodies parsed into the core's
request and core events rendered back, on literal values; keep_alive on a ModelPool with a
fake loader; then the real ``ollama`` client against a real `edgespec serve` (smollm2-135m,
with qwen-0.5b beside it for tools and fill-in-the-middle) listening on a second, Ollama
port."""
from __future__ import annotations

import json
import socket
import time

import pytest
from server_env import COUNTING, FIM_MODEL, MODEL

from edgespec.api.stats import RequestStats
from edgespec.protocol.errors import ProtocolError
from edgespec.protocol.events import ChoiceDone, ToolCall
from edgespec.server.dialects import ollama_wire as ow
from edgespec.serving import ModelPool, PoolModel


def chat(**body):
    body.setdefault("model", "m")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ow.parse_chat(body, 512)


def refused(fn, **body) -> ProtocolError:
    body.setdefault("model", "m")
    with pytest.raises(ProtocolError) as e:
        fn(body, 512)
    return e.value


def done(text="", *, finish="stop", reasoning=None, calls=(), prompt=7, completion=3):
    return ChoiceDone(0, finish, "eos", text, reasoning, tuple(calls), prompt, completion,
                      {"prompt_ms": 12.5, "predicted_ms": 250.0}, RequestStats())


# --- parsing ---------------------------------------------------------------------------------
def test_options_map_onto_the_engine_with_ollama_defaults():
    r = chat(options={"num_predict": 20, "temperature": 0, "seed": 7, "stop": ["\n\n"],
                      "num_thread": 8, "num_gpu": 0, "typical_p": 1.0, "num_ctx": 512},
             format="json", stream=False)
    p = r.core.params
    assert (p.max_tokens, p.stop, p.json_mode, r.stream, r.num_ctx) == (20, ("\n\n",), True,
                                                                        False, 512)
    assert (p.sampling.temperature, p.sampling.seed, p.sampling.top_k,
            p.sampling.top_p) == (0.0, 7, 40, 0.9)
    d = chat().core.params  # nothing named: Ollama's own defaults
    assert (d.sampling.temperature, d.sampling.top_k, d.sampling.top_p, d.max_tokens) == \
        (0.8, 40, 0.9, 512)
    assert chat(options={"num_predict": -1}).core.params.max_tokens == 512
    assert chat(format={"type": "object"}).core.params.json_schema == {"type": "object"}


@pytest.mark.parametrize("body, param", [
    ({"options": {"mirostat": 2}}, "options.mirostat"),
    ({"options": {"frobnicate": 1}}, "options.frobnicate"),
    ({"options": {"temperature": "hot"}}, "options.temperature"),
    ({"options": {"num_predict": 100000}}, "options.num_predict"),
    ({"options": {"seed": -5}}, "options.seed"),
    ({"format": "yaml"}, "format"),
    ({"think": "very"}, "think"),
    ({"keep_alive": "soon"}, "keep_alive"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages.0.images"),
    ({"messages": [{"role": "user", "content": "x"},
                   {"role": "tool", "content": "18C", "tool_name": "weather"}]},
     "messages.1.tool_name"),
    ({"model": ""}, "model"),
])
def test_bad_chat_bodies_are_refused_naming_the_field(body, param):
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    err = refused(ow.parse_chat, **body)
    assert err.status == 400 and err.param == param, err


def test_tool_history_gets_ids_and_results_find_their_calls():
    r = chat(messages=[
        {"role": "user", "content": "Weather in Tokyo and Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "weather", "arguments": {"city": "Tokyo"}}},
            {"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "11C", "tool_name": "weather"},
        {"role": "tool", "content": "18C"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}])
    msgs = r.core.messages
    calls = msgs[1]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Tokyo"},
                                                                        {"city": "Paris"}]
    assert msgs[2]["tool_call_id"] == calls[0]["id"] and msgs[3]["tool_call_id"] == calls[1]["id"]
    assert msgs[2]["name"] == "weather" and r.core.tools[0]["function"]["name"] == "weather"


def test_generate_modes():
    g = ow.parse_generate({"model": "m", "prompt": "Hi", "system": "Be brief."}, 64)
    assert g.core.messages == ({"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi"})
    raw = ow.parse_generate({"model": "m", "prompt": "[INST] x [/INST]", "raw": True}, 64)
    assert raw.core.prompt == "[INST] x [/INST]" and raw.core.params.chat is False
    fim = ow.parse_generate({"model": "m", "prompt": "def f(", "suffix": "    return x"}, 64)
    assert (fim.core.fim.prefix, fim.core.fim.suffix) == ("def f(", "    return x")
    load = ow.parse_generate({"model": "m"}, 64)
    assert load.core is None and load.keep_alive is None
    unload = ow.parse_generate({"model": "m", "keep_alive": 0}, 64)
    assert unload.core is None and unload.keep_alive == 0
    for body, param in [({"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
                        ({"prompt": "x", "context": [1, 2]}, "context"),
                        ({"prompt": "x", "raw": True, "system": "s"}, "system"),
                        ({"prompt": "x", "suffix": "y", "system": "s"}, "system"),
                        ({"prompt": "x", "images": ["aGk="]}, "images")]:
        assert refused(ow.parse_generate, **body).param == param


def test_think_maps_onto_the_reasoning_split():
    assert chat(think=True).core.reasoning_format == "deepseek"
    off = chat(think=False).core
    assert off.chat_template_kwargs == {"enable_thinking": False}
    assert chat().core.reasoning_format is None  # the server's default


def test_keep_alive_durations():
    assert ow.parse_keep_alive("5m") == 300 and ow.parse_keep_alive("1h30m") == 5400
    assert ow.parse_keep_alive("-1") == -1 and ow.parse_keep_alive(0) == 0
    assert ow.parse_keep_alive("250ms") == 0.25 and ow.parse_keep_alive(90) == 90


def test_num_ctx_above_the_loaded_context_is_refused():
    ow.check_num_ctx(None, 1024, "m")
    ow.check_num_ctx(1024, 1024, "m")
    with pytest.raises(ProtocolError) as e:
        ow.check_num_ctx(8192, 1024, "m")
    assert e.value.status == 400 and e.value.param == "options.num_ctx"
    assert "--ctx 8192" in e.value.message


# --- rendering -------------------------------------------------------------------------------
def test_final_objects_carry_real_durations_in_nanoseconds():
    out = ow.Renderer("chat", "m")
    final = out.final(done("Hello", reasoning="hmm"), ow.Timing(total=1.5, load=0.25),
                      whole=True)
    assert final["message"] == {"role": "assistant", "content": "Hello", "thinking": "hmm"}
    assert final["done"] is True and final["done_reason"] == "stop"
    assert (final["total_duration"], final["load_duration"], final["prompt_eval_duration"],
            final["eval_duration"]) == (1_500_000_000, 250_000_000, 12_500_000, 250_000_000)
    assert (final["prompt_eval_count"], final["eval_count"]) == (7, 3)
    assert final["timings"]["predicted_ms"] == 250.0
    assert final["created_at"].endswith("Z")
    streamed = out.final(done("Hello", finish="length"), ow.Timing(), whole=False)
    assert streamed["message"]["content"] == "" and streamed["done_reason"] == "length"
    g = ow.Renderer("generate", "m")
    assert g.delta("x", thinking="t") | {"created_at": 0} == {
        "model": "m", "created_at": 0, "response": "x", "thinking": "t", "done": False}


def test_logprobs_are_asked_for_and_rendered():
    from edgespec.api.events import TokenLogprob
    r = chat(logprobs=True, top_logprobs=2)
    assert r.logprobs and r.core.params.logprobs == 2
    assert chat(top_logprobs=2).core.params.logprobs is None  # only with logprobs: true
    assert refused(ow.parse_chat, messages=[{"role": "user", "content": "x"}], logprobs=True,
                   top_logprobs=50).param == "top_logprobs"
    pieces = {1: b"Hi", 2: b"!"}
    body = ow.Renderer("generate", "m", pieces.__getitem__).delta(
        "Hi", lps=(TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.5))),))
    assert body["logprobs"] == [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                                 "top_logprobs": [
                                     {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                                     {"token": "!", "logprob": -1.5, "bytes": [33]}]}]


def test_tool_calls_are_rendered_with_object_arguments():
    calls = (ToolCall("call_1", "weather", '{"city": "Tokyo"}'),)
    body = ow.Renderer("chat", "m").final(done(calls=calls, finish="tool_calls"), ow.Timing(),
                                          whole=True)
    assert body["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "weather",
                                      "arguments": {"city": "Tokyo"}}}]
    assert body["done_reason"] == "stop"


# --- keep_alive on the pool ------------------------------------------------------------------
class _Engine:
    def close(self):
        pass


class _Sched:
    def load(self):
        from edgespec.serving import QueueLoad
        return QueueLoad(0, 0, 1, 0)

    def close(self, drain=True):
        pass


def test_keep_alive_zero_unloads_and_a_duration_is_reaped():
    loads = []
    pool = ModelPool([PoolModel("a", config=object()), PoolModel("b", config=object())],
                     load=lambda m: (loads.append(m.name), (_Engine(), _Sched()))[1])
    try:
        pool.acquire("a").release()
        assert pool.unload("a") and pool.find("a").engine is None
        pool.acquire("b").release()
        pool.keep("b", 0.1)
        deadline = time.monotonic() + 5
        while pool.find("b").engine is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.find("b").engine is None  # unloaded by the reaper after 0.1 s idle
        pool.acquire("b").release()
        pool.keep("b", -1)  # kept until memory is needed
        time.sleep(0.3)
        assert pool.find("b").engine is not None and loads == ["a", "b", "b"]
    finally:
        pool.close()


def test_a_preloaded_model_with_no_loader_is_not_unloaded():
    pool = ModelPool.single("only", (), _Engine(), _Sched())
    try:
        assert pool.unload("only") is False and pool.find("only").engine is not None
    finally:
        pool.close()


# --- a real server, the real client ----------------------------------------------------------
@pytest.fixture
def served(dialect_server):
    return dialect_server


@pytest.fixture
def client(served):
    import ollama
    return ollama.Client(host=served.ollama_url, timeout=180)


def test_list_show_ps_and_version(served, client):
    names = [m.model for m in client.list().models]
    assert names == [f"{MODEL}:latest", f"{FIM_MODEL}:latest"]
    first = client.list().models[0]
    assert first.size > 0 and len(first.digest) == 64 and first.details.format == "gguf"
    shown = client.show(MODEL)
    assert shown.details.family and "completion" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == shown.details.family
    assert "tools" in client.show(FIM_MODEL).capabilities
    assert f"{MODEL}:latest" in [m.model for m in client.ps().models]
    status, _, body = served.request("GET", "/api/version")
    assert status == 200 and json.loads(body)["version"]


def test_chat_whole_and_streamed_agree_greedy(client):
    msgs = [{"role": "user", "content": "Name three colours."}]
    opts = {"temperature": 0, "num_predict": 16}
    whole = client.chat(MODEL, msgs, options=opts)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.eval_count and whole.eval_duration > 0 and whole.prompt_eval_count > 5
    assert whole.total_duration >= whole.eval_duration
    lp = client.chat(MODEL, msgs, options=opts, logprobs=True, top_logprobs=2)
    assert len(lp.logprobs) == lp.eval_count and len(lp.logprobs[0].top_logprobs) == 2
    parts = list(client.chat(MODEL, msgs, options=opts, stream=True))
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


def test_generate_with_suffix_fills_the_middle(client):
    r = client.generate(FIM_MODEL, "def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                        options={"temperature": 0, "num_predict": 12})
    assert r.done and "return" in r.response and r.eval_count > 0


def test_tools_come_back_as_calls_with_object_arguments(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    r = client.chat(FIM_MODEL, [{"role": "user", "content": "What is the weather in Tokyo? "
                                                            "Use the tool."}],
                    tools=tools, options={"temperature": 0, "num_predict": 64})
    assert r.message.tool_calls, r.message
    call = r.message.tool_calls[0].function
    assert call.name == "get_weather" and isinstance(call.arguments, dict)
    assert "tokyo" in str(call.arguments.get("city", "")).lower()
    # the result goes back with tool_name, matched to the call (what the 0.5B model makes
    # of it is its own business: it may well call again)
    after = client.chat(FIM_MODEL, [
        {"role": "user", "content": "What is the weather in Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [r.message.tool_calls[0]]},
        {"role": "tool", "content": "11 degrees celsius", "tool_name": "get_weather"}],
        tools=tools, options={"temperature": 0, "num_predict": 32})
    assert after.done and after.eval_count > 0


def test_bad_input_is_ollama_shaped(served, client):
    import ollama
    with pytest.raises(ollama.ResponseError) as e:
        client.chat("no-such-model", [{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and "no-such-model" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(MODEL, [{"role": "user", "content": "hi"}], options={"mirostat": 2})
    assert e.value.status_code == 400 and "mirostat" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:  # above the loaded context (--ctx 1024)
        client.chat(MODEL, [{"role": "user", "content": "hi"}], options={"num_ctx": 4096})
    assert e.value.status_code == 400 and "--ctx 4096" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:  # smollm2 has no tool template
        client.chat(MODEL, [{"role": "user", "content": "hi"}], tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:  # smollm2 has no FIM tokens
        client.generate(MODEL, "def f(", suffix="    return 1\n")
    assert e.value.status_code == 400 and MODEL in e.value.error
    status, _, body = served.request("POST", "/api/chat", b"{not json")
    assert status == 400 and set(json.loads(body)) == {"error"}


def test_root_says_ollama_is_running_only_on_the_ollama_port(served):
    import http.client
    host, port = served.ollama_url[len("http://"):].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/")
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"Ollama is running")
        conn.request("HEAD", "/")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b""
    finally:
        conn.close()
    status, _, body = served.request("GET", "/")
    assert body != b"Ollama is running"  # the main port's / is the web page (or a 404)


def test_keep_alive_zero_unloads_the_model(client):
    assert client.generate(FIM_MODEL, "Hi", options={"num_predict": 2}).done
    assert f"{FIM_MODEL}:latest" in [m.model for m in client.ps().models]
    r = client.generate(FIM_MODEL, keep_alive=0)
    assert r.done_reason == "unload"
    assert f"{FIM_MODEL}:latest" not in [m.model for m in client.ps().models]


def test_a_client_leaving_mid_stream_frees_its_slot(served):
    host, port = served.ollama_url[len("http://"):].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)
    body = json.dumps({"model": MODEL, "prompt": COUNTING, "raw": True,
                       "options": {"num_predict": 500, "temperature": 0}}).encode()
    sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: " + host.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while b'"done": false' not in seen:
        seen += sock.recv(4096)
    assert served.health()["running"] == 1
    sock.close()
    assert served.wait_idle(20)["running"] == 0
