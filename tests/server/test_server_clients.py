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
