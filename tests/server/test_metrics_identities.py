"""Metrics that add up (issue #43 item 5): a mix of requests against a real server (answered
whole and streamed, n = 2, refused by the route and by the guard, clients that go away while
running and while queued), then the identities: every request counted exactly once as
finished, rejected or failed; cancelled = client disconnects observed; a dropped
non-streaming request not counted a second time as a 499."""
from __future__ import annotations

import json
import re
import socket
import time

import pytest
from server_env import COUNTING, MODEL, base_args

from tools.soak import ServeProcess

LONG = {"model": MODEL, "prompt": COUNTING, "max_tokens": 900, "temperature": 0.0}
SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
         "temperature": 0.0}


@pytest.fixture(scope="module")
def server(model_path):
    model_path(MODEL)
    with ServeProcess(base_args("--proposer", "ngram", "--parallel", "2", "--max-queue", "2",
                                "--max-tokens-limit", "900")) as s:
        yield s


def scrape(server) -> dict[str, float]:
    _, _, body = server.request("GET", "/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = re.match(r"^(edgespec_(?:requests_\w+_total|client_disconnects_total))(\{[^}]*\})? "
                     r"([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def total(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def stream_then_drop(server, body=LONG):
    conn = server.connect()
    conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    line = resp.readline()
    while line.startswith(b":") or not line.strip():  # SSE pings on a slow first token
        line = resp.readline()
    assert line.startswith(b"data: ")
    return conn


def drop(conn) -> None:
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def wait_for(server, running: int, queued: int = 0, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = server.health()
        if h["running"] == running and h["queued"] == queued:
            return
        time.sleep(0.05)
    raise AssertionError(f"never {running} running and {queued} queued: {server.health()}")


def test_every_request_is_counted_once(server):
    before = scrape(server)
    sent = disconnects = 0

    for body in (SHORT, {**SHORT, "n": 2}, {**SHORT, "stream": True}):  # answered
        status, _, _ = server.request("POST", "/v1/chat/completions", body)
        assert status == 200
        sent += 1
    status, _, _ = server.request("POST", "/v1/completions", {**LONG, "max_tokens": 3})
    assert status == 200
    sent += 1

    refusals = [("/v1/chat/completions", b'{"model": ', {}),  # not JSON
                ("/v1/completions", {**LONG, "logit_bias": {"\u00b2": 1}}, {}),  # "²"
                ("/v1/completions", {**LONG, "model": "nope"}, {}),  # 404
                ("/v1/completions", LONG, {"Content-Type": "text/plain"}),  # the guard: 415
                ("/v1/completions", LONG, {"Host": "attacker.example"})]  # the guard: 403
    for path, body, headers in refusals:
        status, _, _ = server.request("POST", path, body, headers)
        assert 400 <= status < 500, (path, status)
        sent += 1

    # clients that go away while their request runs: streamed, and answered whole
    for _ in range(2):
        drop(stream_then_drop(server))
        sent, disconnects = sent + 1, disconnects + 1
        wait_for(server, running=0)
    whole = server.connect()
    whole.request("POST", "/v1/completions", body=json.dumps(LONG),
                  headers={"Content-Type": "application/json"})
    wait_for(server, running=1)
    drop(whole)
    sent, disconnects = sent + 1, disconnects + 1
    wait_for(server, running=0)

    # and one that goes away while queued behind two running streams
    running = [stream_then_drop(server), stream_then_drop(server)]
    queued = server.connect()
    queued.request("POST", "/v1/completions", body=json.dumps(LONG),
                   headers={"Content-Type": "application/json"})
    wait_for(server, running=2, queued=1)
    drop(queued)
    wait_for(server, running=2, queued=0)
    for conn in running:
        drop(conn)
    sent, disconnects = sent + 3, disconnects + 3
    wait_for(server, running=0)
    time.sleep(0.5)  # the last events reach the metrics

    after = scrape(server)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}
    finished = total(d, "edgespec_requests_finished_total")
    rejected = total(d, "edgespec_requests_rejected_total")
    failed = total(d, "edgespec_requests_failed_total")
    summary = {k: v for k, v in sorted(d.items()) if v}
    assert finished + rejected + failed == sent, summary
    assert failed == 0 and rejected == len(refusals), summary
    cancelled = d.get('edgespec_requests_finished_total{stop_reason="cancelled"}', 0.0)
    assert cancelled == disconnects == d.get("edgespec_client_disconnects_total"), summary
    assert not any('status="499"' in k or 'code="dropped"' in k for k in summary), summary
