"""edgespec serve beside llama-server on the same model (smollm2-135m), the same requests to
every endpoint both serve: the answers' field sets must match but for the differences
docs/server.md lists (DOCUMENTED below, each with its reason), and greedy text must be the
same.

llama-server is the one `make anchors` builds from the llama.cpp that llama-cpp-python
vendors (edgespec.lab.bench.anchors.paths), started with edgespec's kernel configuration (flash
attention, a Q8_0 KV cache) so that both compute the same logits; without it the test
skips, saying how to build it.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import httpx
import pytest
from server_env import COUNTING, MODEL, THREADS

from edgespec.lab.bench.anchors.paths import anchors_bin_dir
from edgespec.planner import kernels

#: what edgespec adds or leaves out, per endpoint and field path; the reasons are in
#: docs/server.md ("llama.cpp native: differences from llama-server")
DOCUMENTED = {
    # (endpoint, path): (fields edgespec adds, fields edgespec leaves out)
    ("/health", ""): ({"model", "queued", "running", "slots", "max_queue", "models"}, set()),
    ("/completion", "timings"): ({"proposer", "draft_n", "draft_n_accepted"}, set()),
    ("/props", ""): ({"edgespec"}, set()),
    ("/props", "default_generation_settings"): (set(), set()),
    ("/slots", "[idle]"): (set(), {"id_task", "n_prompt_tokens", "n_prompt_tokens_processed",
                                   "n_prompt_tokens_cache", "params", "next_token", "prompt",
                                   "generated"}),
    ("/v1/health", ""): ({"slots_idle", "slots_processing"}, set()),
    # the OpenAI routes: edgespec's speculation stats; OpenAI's own always-present nulls
    ("/v1/completions", ""): ({"edgespec"}, set()),
    ("/v1/chat/completions", ""): ({"edgespec"}, set()),
    ("/v1/chat/completions", "choices.0"): ({"logprobs"}, set()),
    ("/v1/chat/completions", "message"): ({"refusal"}, set()),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(ours, model_path):
    binary = anchors_bin_dir() / "llama-server"
    if not os.access(binary, os.X_OK):
        pytest.skip(f"llama-server is not built ({binary} is missing): run `make anchors` "
                    "(shared/docs/anchors.md) to compare edgespec serve with it")
    # the KV cache our server runs: the kernel choice it measured on loading (``ours`` is up
    # first), so the greedy texts compare the same arithmetic
    kv = kernels.cached(model_path(MODEL), n_threads=int(THREADS)).kernel.kv_type
    port = _free_port()
    proc = subprocess.Popen(
        [str(binary), "-m", str(model_path(MODEL)), "--host", "127.0.0.1", "--port", str(port),
         "-c", "2048", "-np", "2", "-t", THREADS, "-fa", "on", "-ctk", kv, "-ctv", kv,
         "--no-webui", "--no-warmup"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("llama-server did not start:\n" + proc.stderr.read()[-4000:])
            time.sleep(0.5)
        # a new connection per request: llama-server (cpp-httplib) may close a kept-alive
        # one just as the client reuses it ("Server disconnected without sending a
        # response", seen under load); what is compared here is the answers
        with httpx.Client(base_url=url, timeout=180,
                          limits=httpx.Limits(max_keepalive_connections=0)) as c:
            yield c
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def ours(dialect_server):
    with httpx.Client(base_url=dialect_server.base_url, timeout=180) as c:
        yield c


def same_fields(endpoint: str, path: str, theirs: dict, mine: dict) -> None:
    """The field sets agree but for the documented additions and omissions."""
    added, left_out = DOCUMENTED.get((endpoint, path), (set(), set()))
    extra = set(mine) - set(theirs) - added
    missing = set(theirs) - set(mine) - left_out
    assert not extra and not missing, \
        f"{endpoint} {path or '(top)'}: edgespec adds {sorted(extra)}, lacks {sorted(missing)}"


def both(ours, theirs, method: str, path: str, body=None):
    a = ours.request(method, path, json=body)
    b = theirs.request(method, path, json=body)
    return a, b


def test_completion_fields_and_greedy_text(llama_server, ours):
    body = {"prompt": COUNTING, "n_predict": 16, "temperature": 0, "return_tokens": True}
    a, b = both(ours, llama_server, "POST", "/completion", body)
    assert a.status_code == b.status_code == 200
    mine, theirs = a.json(), b.json()
    same_fields("/completion", "", theirs, mine)
    same_fields("/completion", "timings", theirs["timings"], mine["timings"])
    same_fields("/completion", "generation_settings", theirs["generation_settings"],
                mine["generation_settings"])
    assert mine["content"] == theirs["content"]
    assert mine["tokens"] == theirs["tokens"]
    assert (mine["tokens_predicted"], mine["stop_type"]) == (theirs["tokens_predicted"],
                                                             theirs["stop_type"])
    assert mine["tokens_evaluated"] == theirs["tokens_evaluated"]


def test_stop_words_and_eos(llama_server, ours):
    body = {"prompt": COUNTING, "n_predict": 32, "temperature": 0, "stop": [" 15"]}
    a, b = both(ours, llama_server, "POST", "/completion", body)
    mine, theirs = a.json(), b.json()
    assert mine["content"] == theirs["content"]
    assert mine["stop_type"] == theirs["stop_type"] == "word"
    assert mine["stopping_word"] == theirs["stopping_word"]


def test_streamed_completion(llama_server, ours):
    body = {"prompt": COUNTING, "n_predict": 12, "temperature": 0, "stream": True}

    def events(client):
        with client.stream("POST", "/completion", json=body) as r:
            assert r.status_code == 200
            return [json.loads(l[len("data: "):]) for l in r.iter_lines()
                    if l.startswith("data: ")]

    mine, theirs = events(ours), events(llama_server)
    assert mine[-1]["stop"] and theirs[-1]["stop"]
    same_fields("/completion (stream)", "", theirs[0], mine[0])
    same_fields("/completion (stream)", "[final]", theirs[-1], mine[-1])
    assert "".join(e["content"] for e in mine) == "".join(e["content"] for e in theirs)
    assert mine[-1]["tokens_predicted"] == theirs[-1]["tokens_predicted"]


def test_tokenize_detokenize_and_templates(llama_server, ours):
    for body in ({"content": "Hello world, ça va?"},
                 {"content": "Hello world, ça va?", "add_special": True, "with_pieces": True},
                 {"content": "<|im_start|>user", "parse_special": False}):
        a, b = both(ours, llama_server, "POST", "/tokenize", body)
        assert a.json() == b.json(), body
    ids = a.json()["tokens"]
    a, b = both(ours, llama_server, "POST", "/detokenize", {"tokens": [t["id"] if isinstance(
        t, dict) else t for t in ids]})
    assert a.json() == b.json()
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a colour."}]
    a, b = both(ours, llama_server, "POST", "/apply-template", {"messages": messages})
    assert a.json() == b.json()


def test_props_slots_and_health(llama_server, ours):
    mine, theirs = ours.get("/props").json(), llama_server.get("/props").json()
    same_fields("/props", "", theirs, mine)
    same_fields("/props", "default_generation_settings", theirs["default_generation_settings"],
                mine["default_generation_settings"])
    same_fields("/props", "default_generation_settings.params",
                theirs["default_generation_settings"]["params"],
                mine["default_generation_settings"]["params"])
    assert mine["chat_template"] == theirs["chat_template"]
    assert (mine["bos_token"], mine["eos_token"]) == (theirs["bos_token"], theirs["eos_token"])
    mine_slots, their_slots = ours.get("/slots").json(), llama_server.get("/slots").json()
    assert len(mine_slots) == len(their_slots) == 2
    for m, t in zip(mine_slots, their_slots):
        same_fields("/slots", "[idle]", t, m)
    for path in ("/health", "/v1/health"):
        a, b = ours.get(path), llama_server.get(path)
        assert a.status_code == b.status_code == 200 and a.json()["status"] == "ok"
        same_fields(path, "", b.json(), a.json())


def test_infill_without_fim_tokens_is_refused_alike(llama_server, ours):
    body = {"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 4}
    a, b = both(ours, llama_server, "POST", "/infill", body)
    assert a.status_code == b.status_code == 501
    assert a.json()["error"]["type"] == b.json()["error"]["type"] == "not_supported_error"
    assert set(a.json()["error"]) == set(b.json()["error"])


def test_openai_completions_and_chat(llama_server, ours):
    """The OpenAI routes both serve: field sets (top level, choice, message, usage) and
    greedy text."""
    comp = {"model": MODEL, "prompt": COUNTING, "max_tokens": 12, "temperature": 0}
    a, b = both(ours, llama_server, "POST", "/v1/completions", comp)
    assert a.status_code == b.status_code == 200
    mine, theirs = a.json(), b.json()
    same_fields("/v1/completions", "", theirs, mine)
    same_fields("/v1/completions", "choices.0", theirs["choices"][0], mine["choices"][0])
    same_fields("/v1/completions", "usage", theirs["usage"], mine["usage"])
    assert mine["choices"][0]["text"] == theirs["choices"][0]["text"]
    chat = {"model": MODEL, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Name three colours."}]}
    a, b = both(ours, llama_server, "POST", "/v1/chat/completions", chat)
    assert a.status_code == b.status_code == 200
    mine, theirs = a.json(), b.json()
    same_fields("/v1/chat/completions", "", theirs, mine)
    same_fields("/v1/chat/completions", "choices.0", theirs["choices"][0], mine["choices"][0])
    same_fields("/v1/chat/completions", "message", theirs["choices"][0]["message"],
                mine["choices"][0]["message"])
    same_fields("/v1/chat/completions", "usage", theirs["usage"], mine["usage"])
    assert mine["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
