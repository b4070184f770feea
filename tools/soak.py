"""Soak test for `edgespec serve`: mixed requests, cancellations and disconnects against a
real server on loopback, then checks that nothing leaked.

    nice -n 19 .venv/bin/python tools/soak.py --seconds 600       # what `make soak` runs

Passes when: no request got an unexpected answer, the server's RSS grew less than 5% from
the end of the warm-up to the end, and the scheduler reports nothing running or queued
once the clients stop. tests/server/test_server_soak.py runs the same soak for one minute.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

#: the line `edgespec serve` prints once it listens
_READY = re.compile(r"^edgespec serve: .* on (http://[^/\s]+)/v1")


class ServeProcess:
    """`edgespec serve --port 0 ARGS...` in a subprocess; ``base_url`` once it listens."""

    def __init__(self, args: list[str], *, env: dict | None = None,
                 startup_seconds: float = 180.0) -> None:
        cmd = [sys.executable, "-c", "from edgespec.cli import main; main()", "serve",
               "--port", "0", "--log-level", "warning", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.log: list[str] = []
        self._ready = threading.Event()
        self.base_url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(startup_seconds) or not self.base_url:
            self.kill()
            raise RuntimeError("edgespec serve did not start:\n" + "".join(self.log[-40:]))
        host, port = self.base_url[len("http://"):].rsplit(":", 1)
        self.host, self.port = host, int(port)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            m = _READY.match(line)
            if m:
                self.base_url = m.group(1)
                self._ready.set()
        self._ready.set()  # exited before it listened

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "ServeProcess":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop(timeout=30)
        finally:
            self.kill()

    # --- plain HTTP (the openai client hides disconnects and raw bytes) ------------------
    def connect(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                headers: dict | None = None, timeout: float = 120.0) -> tuple[int, dict, bytes]:
        conn = self.connect(timeout)
        try:
            if isinstance(body, dict):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def health(self) -> dict:
        # with --api-key, /health without the key is a bare liveness answer: send the key
        args = self.proc.args
        key = args[args.index("--api-key") + 1] if "--api-key" in args else None
        status, _, body = self.request("GET", "/health", headers={
            "Authorization": f"Bearer {key}"} if key else None)
        assert status == 200, body
        return json.loads(body)

    def wait_idle(self, timeout: float = 15.0) -> dict:
        """/health once nothing runs or waits (or the last reading at the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if (h["running"] == 0 and h["queued"] == 0) or time.monotonic() > deadline:
                return h
            time.sleep(0.1)

    def rss(self) -> int:
        import psutil
        return psutil.Process(self.pid).memory_info().rss


# --- the workload -------------------------------------------------------------------------
PROMPTS = ["Name three colours.", "What is 2 + 2?", "Write a haiku about the sea.",
           "Fix the bug: def add(a, b): return a - b", "List the days of the week."]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # continues for as long as it is allowed to


@dataclass
class Report:
    counts: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    rss_warm: int = 0
    rss_end: int = 0
    rss_trace: list = field(default_factory=list)  # samples after the warm-up
    final_load: dict = field(default_factory=dict)
    failed_metric: float = 0.0
    metrics: str = ""  # the last /metrics scrape

    @property
    def rss_growth(self) -> float:
        return (self.rss_end - self.rss_warm) / self.rss_warm if self.rss_warm else 0.0

    @property
    def ok(self) -> bool:
        return (not self.errors and self.rss_growth < 0.05 and self.failed_metric == 0
                and self.final_load.get("running") == 0 and self.final_load.get("queued") == 0)

    def summary(self) -> str:
        n = sum(self.counts.values())
        return (f"{n} requests ({', '.join(f'{k} {v}' for k, v in sorted(self.counts.items()))}); "
                f"{len(self.errors)} errors; RSS {self.rss_warm / 2**20:.1f} -> "
                f"{self.rss_end / 2**20:.1f} MiB ({self.rss_growth:+.1%}; samples "
                f"{' '.join(f'{r / 2**20:.0f}' for r in self.rss_trace)}); final load "
                f"{self.final_load}; requests_failed {self.failed_metric:g}")


def _chat(rnd, model, stream=False, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": rnd.choice(PROMPTS)}],
            "max_tokens": rnd.randint(4, 24), "temperature": rnd.choice([0.0, 0.8]),
            "seed": rnd.randint(0, 1000), "stream": stream, **extra}


def _action(server: ServeProcess, rnd: random.Random, model: str) -> tuple[str, str | None]:
    """One random request; returns (kind, error or None)."""
    kind = rnd.choice(["chat", "chat_stream", "completion", "json", "stream_disconnect",
                       "whole_disconnect", "bad_request"])
    if kind == "chat":
        status, _, body = server.request("POST", "/v1/chat/completions", _chat(rnd, model))
        ok = status == 200 and json.loads(body)["choices"]
        return kind, None if ok else f"{status} {body[:200]!r}"
    if kind == "json":
        status, _, body = server.request("POST", "/v1/chat/completions", _chat(
            rnd, model, response_format={"type": "json_object"}))
        return kind, None if status == 200 else f"{status} {body[:200]!r}"
    if kind == "completion":
        status, _, body = server.request("POST", "/v1/completions", {
            "model": model, "prompt": COUNTING, "max_tokens": rnd.randint(4, 24),
            "temperature": 0.0, "logprobs": rnd.choice([None, 2])})
        return kind, None if status == 200 else f"{status} {body[:200]!r}"
    if kind == "bad_request":
        status, _, body = server.request("POST", "/v1/chat/completions", rnd.choice([
            b'{"model": ', b'\xff\xfe', {"model": model, "messages": [], "n": 2},
            {"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}]))
        ok = status in (400, 404) and "error" in json.loads(body)
        return kind, None if ok else f"{status} {body[:200]!r}"
    conn = server.connect()
    try:
        if kind == "chat_stream":
            conn.request("POST", "/v1/chat/completions",
                         body=json.dumps(_chat(rnd, model, stream=True)))
            resp = conn.getresponse()
            data = resp.read()
            return kind, None if resp.status == 200 and b"data: [DONE]" in data \
                else f"{resp.status} {data[-200:]!r}"
        if kind == "stream_disconnect":
            conn.request("POST", "/v1/completions", body=json.dumps({
                "model": model, "prompt": COUNTING, "max_tokens": 200, "stream": True,
                "temperature": 0.0}))
            resp = conn.getresponse()
            if resp.status != 200:
                return kind, f"{resp.status} {resp.read()[:200]!r}"
            for _ in range(rnd.randint(1, 6)):
                resp.readline()
            return kind, None
        # whole_disconnect: the client gives up before the answer
        conn.request("POST", "/v1/completions", body=json.dumps({
            "model": model, "prompt": COUNTING, "max_tokens": 200, "temperature": 0.0}))
        time.sleep(rnd.uniform(0.05, 0.6))
        return kind, None
    finally:
        conn.close()


def soak(server: ServeProcess, seconds: float, *, model: str, clients: int = 3,
         seed: int = 0, warmup: float | None = None) -> Report:
    """Drive ``server`` with ``clients`` threads of random requests for ``seconds``."""
    report = Report()
    lock = threading.Lock()
    start = time.monotonic()
    end = start + seconds
    # allocator arenas, the bounded caches (KV states in RAM, suffix trees, n-gram tables)
    # and the grammar compiler fill first; RSS is compared from the end of this warm-up
    warmup = min(60.0, seconds / 3) if warmup is None else warmup

    def client(i: int) -> None:
        rnd = random.Random(seed * 1000 + i)
        while time.monotonic() < end:
            try:
                kind, err = _action(server, rnd, model)
            except Exception as e:  # a refused connection, a timeout: the server misbehaved
                kind, err = "exception", f"{type(e).__name__}: {e}"
            with lock:
                report.counts[kind] = report.counts.get(kind, 0) + 1
                if err:
                    report.errors.append(f"{kind}: {err}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(min(warmup, seconds))
    report.rss_warm = server.rss()
    while any(t.is_alive() for t in threads) and time.monotonic() < end + 300:
        report.rss_trace.append(server.rss())
        time.sleep(min(10.0, max(seconds / 10, 0.5)))
    for t in threads:
        t.join(1)
    report.final_load = server.wait_idle()
    report.rss_end = server.rss()
    _, _, metrics = server.request("GET", "/metrics")
    report.metrics = metrics.decode()
    m = re.search(rb"^edgespec_requests_failed_total ([0-9.e+]+)$", metrics, re.M)
    report.failed_metric = float(m.group(1)) if m else float("nan")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("serve_args", nargs="*", help="more `edgespec serve` flags (after --)")
    a = ap.parse_args(argv)
    args = ["--target", a.target, "--ctx", "1024", "--proposer", "ngram+suffix",
            "--parallel", "2", "--threads", os.environ.get("EDGESPEC_TEST_THREADS", "2"),
            # earlier conversations' KV states are kept up to a budget (256 MiB by default);
            # a small one fills during the warm-up, so growth after it is a leak
            "--cache-ram", "8", "--canary", "0.2",
            *a.serve_args]
    with ServeProcess(args) as server:
        report = soak(server, a.seconds, model=a.target, clients=a.clients, seed=a.seed)
    print(report.summary())
    for e in report.errors[:20]:
        print("  " + e)
    print("PASS" if report.ok else "FAIL")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
