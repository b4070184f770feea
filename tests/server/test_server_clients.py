"""Clients a real `edgespec serve` must not trip over (issue #29): fields it does not know,
error codes, connections that go silent, disconnects in a row, browsers (CORS)."""
from __future__ import annotations

import json
import re
import socket
import time

import pytest
from server_env import COUNTING, MODEL, base_args

from tools.soak import ServeProcess


def metrics_text(server) -> str:
    return server.request("GET", "/metrics")[2].decode()


def value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_back_to_back_disconnects_are_each_counted(server):
    """Four streams, each dropped right after its first chunk: four cancelled requests in
    the outcome counter and four observations in the latency histogram, not one."""
    cancelled = 'edgespec_requests_finished_total{stop_reason="cancelled"}'
    e2e = "edgespec_e2e_request_latency_seconds_count"
    before = metrics_text(server)
    for _ in range(4):
        conn = server.connect()
        conn.request("POST", "/v1/completions", body=json.dumps({
            "model": MODEL, "prompt": COUNTING, "max_tokens": 512, "stream": True,
            "temperature": 0.0}), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
    assert server.wait_idle(15)["running"] == 0
    deadline = time.monotonic() + 5
    while True:
        after = metrics_text(server)
        if value(after, cancelled) >= value(before, cancelled) + 4 or \
                time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert value(after, cancelled) == value(before, cancelled) + 4
    assert value(after, e2e) == value(before, e2e) + 4


@pytest.fixture(scope="module")
def timed_server(model_path):
    """Short read and keep-alive timeouts (1 s), and --strict."""
    model_path(MODEL)
    with ServeProcess(base_args("--proposer", "none", "--timeout-read", "1",
                                "--timeout-keep-alive", "1", "--strict")) as s:
        yield s


def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before it closed the connection, waiting at most ``seconds``."""
    sock.settimeout(seconds)
    got = b""
    t0 = time.monotonic()
    while True:
        chunk = sock.recv(4096)  # a timeout here fails the test: the server kept it open
        if not chunk:
            assert time.monotonic() - t0 <= seconds
            return got
        got += chunk


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"])
def test_silent_or_partial_headers_are_disconnected(timed_server, sent):
    with socket.create_connection((timed_server.host, timed_server.port)) as s:
        s.sendall(sent)
        assert closed_within(s, 4) == b""


def test_a_stalled_body_gets_408_and_is_closed(timed_server):
    with socket.create_connection((timed_server.host, timed_server.port)) as s:
        # Host: one the server answers to (others are 403 before the body is read)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 100\r\n\r\n{\"model\":")
        got = closed_within(s, 4)
    assert got.startswith(b"HTTP/1.1 408") and b"request_timeout" in got


def test_strict_refuses_unknown_fields(timed_server):
    status, _, body = timed_server.request("POST", "/v1/completions", {
        "model": MODEL, "prompt": "x", "max_tokens": 1, "mystery": 1})
    assert status == 400 and json.loads(body)["error"]["code"] == "unknown_parameter"
