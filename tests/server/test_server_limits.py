"""Safety limits of a real `edgespec serve`: the API key, the queue (429 + Retry-After), the
max_tokens cap, clients that go away, and a draining shutdown."""
from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time

import pytest
from server_env import API_KEY, COUNTING, MODEL, base_args

from tools.soak import ServeProcess

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
         "temperature": 0.0}


def long_stream(server, headers=None, max_tokens=300, model=MODEL):
    """A streaming completion that runs until max_tokens; returns (connection, response)
    once its first chunk arrived (the request holds a sequence)."""
    conn = server.connect()
    conn.request("POST", "/v1/completions", body=json.dumps({
        "model": model, "prompt": COUNTING, "max_tokens": max_tokens, "stream": True,
        "temperature": 0.0}), headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")
    return conn, resp


def metric(server, name, headers=None) -> float:
    _, _, body = server.request("GET", "/metrics", headers=headers)
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def test_api_key_is_required_when_set(keyed_server):
    from openai import AuthenticationError, OpenAI
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        status, _, body = keyed_server.request("POST", "/v1/chat/completions", HELLO, headers)
        err = json.loads(body)["error"]
        assert status == 401 and err["code"] == "invalid_api_key"
    status, _, _ = keyed_server.request("GET", "/metrics")
    assert status == 401
    assert keyed_server.request("GET", "/health")[0] == 200  # probes need no secret
    with OpenAI(base_url=keyed_server.base_url + "/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(AuthenticationError):
            c.models.list()
    with OpenAI(base_url=keyed_server.base_url + "/v1", api_key=API_KEY, max_retries=0) as c:
        assert c.chat.completions.create(**HELLO).choices[0].message.role == "assistant"


def test_a_full_queue_answers_429_with_retry_after(keyed_server):
    """--parallel 1 --max-queue 0: while one request runs, the next is refused at once."""
    conn, _ = long_stream(keyed_server, AUTH)
    try:
        assert keyed_server.health()["running"] == 1
        status, headers, body = keyed_server.request("POST", "/v1/chat/completions", HELLO, AUTH)
        assert status == 429, body
        assert int(headers["retry-after"]) >= 1
        assert json.loads(body)["error"]["code"] == "queue_full"
    finally:
        conn.close()
    assert keyed_server.wait_idle(5)["running"] == 0
    status, _, body = keyed_server.request("POST", "/v1/chat/completions", HELLO, AUTH)
    assert status == 200, body


def test_max_tokens_above_the_limit_is_refused_not_cut(keyed_server):
    status, _, body = keyed_server.request(
        "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 301}, AUTH)
    err = json.loads(body)["error"]
    assert status == 400 and err["param"] == "max_tokens" and "300" in err["message"]


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_request(server, stream):
    cancelled = 'edgespec_requests_finished_total{stop_reason="cancelled"}'
    before = metric(server, cancelled)
    # the server's whole max_tokens limit: SmolLM2 drafts counting so well that 300 tokens
    # can be done in 1.5 s, a race with the disconnect reaching the scheduler on a busy CI
    if stream:
        conn, _ = long_stream(server, max_tokens=512)
    else:
        conn = server.connect()
        conn.request("POST", "/v1/completions", body=json.dumps({
            "model": MODEL, "prompt": COUNTING, "max_tokens": 512, "temperature": 0.0}),
            headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + 10
        while server.health()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.health()["running"] == 1
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    t0 = time.monotonic()
    load = server.wait_idle(10)
    assert load["running"] == 0 and load["queued"] == 0
    # it ended because it was cancelled, before 512 tokens could have been generated
    assert time.monotonic() - t0 < 3
    assert metric(server, cancelled) == before + 1


def test_sigterm_drains_open_streams_then_exits(model_path):
    model_path(MODEL)
    # a drain window far longer than 40 tokens take, even on a busy machine (the default
    # is 10 s; test_shutdown.py covers what happens after it)
    server = ServeProcess(base_args("--proposer", "none", "--drain-seconds", "60"))
    try:
        conn, resp = long_stream(server, max_tokens=40)
        got = {}

        def read_rest():
            got["data"] = resp.read()

        reader = threading.Thread(target=read_rest)
        reader.start()
        rc = server.stop(signal.SIGTERM, timeout=60)
        reader.join(30)
        conn.close()
        assert rc == 0, "".join(server.log[-20:])
        data = got["data"].decode()
        assert data.rstrip().endswith("data: [DONE]")  # the open stream was finished ...
        finish = [json.loads(line[6:]) for line in data.splitlines()
                  if line.startswith("data: {") and '"finish_reason": "length"' in line]
        assert finish and finish[0]["edgespec"]["stop_reason"] == "length"  # ... not cut
        with pytest.raises(OSError):  # and nothing listens any more
            server.request("GET", "/health", timeout=2)
    finally:
        server.kill()
