"""A target split across machines with llama.cpp's RPC backend, on loopback: two
`edgespec rpc-server` processes started here hold all of SmolLM2's layers, and greedy
output (plain, speculative, exact) equals the run on this machine alone.

The servers compute with their CPU backend's plain weight layout (repacked layouts are a
local buffer type that a remote device does not offer), so the local run compared with is
the plain-layout one: the same kernels, on the same CPU.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.runtime import rpc
from edgespec.cli import cli
from edgespec.config import EngineConfig
from edgespec.runtime.kernel import KernelConfig
from edgespec.engine.engine import Engine
from edgespec.api.params import GenerationParams

PROMPT = ("Write a Python function that returns the n-th Fibonacci number, with a docstring, "
          "then call it for n = 10 and n = 20.\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _edgespec() -> list[str]:
    exe = Path(sys.executable).with_name("edgespec")
    return [str(exe)] if exe.exists() else [shutil.which("edgespec") or "edgespec"]


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(_edgespec() + ["rpc-server", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"rpc-server exited {proc.returncode}: {proc.stderr.read()}")
        try:
            rpc.probe(f"127.0.0.1:{port}", timeout=2)
            return proc
        except rpc.RpcError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("rpc-server did not come up in 60 s")


@pytest.fixture(scope="module")
def servers():
    ports = [_free_port(), _free_port()]
    procs = [start_server(p) for p in ports]
    yield tuple(f"127.0.0.1:{p}" for p in ports)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            p.kill()


def _run(config: EngineConfig, tokens: int = 48) -> tuple[str, dict]:
    """The greedy answer, and where the engine put the target's layers."""
    eng = Engine.from_config(config)
    try:
        text = eng.generate(PROMPT, GenerationParams(max_tokens=tokens)).text
        return text, {"layers": eng.target.n_gpu_layers, "n_layer": eng.target.n_layer,
                      "split": eng.config.tensor_split, "placement": eng.target.placement,
                      "identity": eng.identity.components["runtime"]["rpc"]}
    finally:
        eng.close()


def test_split_across_two_servers_gives_the_local_greedy_output(servers, model_path):
    target = str(model_path("smollm2-135m"))
    local, _ = _run(EngineConfig(target=target, proposer="none", kernel=KernelConfig(repack=False)))
    # the split runs the reference's kernel configuration (Q8_0 + flash attention): the
    # default mode would run this machine's measured choice, whose text may differ from it
    plain, where = _run(EngineConfig(target=target, proposer="none", rpc=servers,
                                     kernel=KernelConfig()))
    # every layer left this machine, half to each server, and the identity says so
    assert where["layers"] == where["n_layer"] + 1 and where["split"] == (0.5, 0.5)
    assert where["identity"] == where["placement"] and where["placement"].startswith("rpc=127.0.0.1,")
    assert plain == local and len(local) > 40
    spec, _ = _run(EngineConfig(target=target, proposer="ngram+suffix", rpc=servers,
                                adaptive=False, max_draft=3, kernel=KernelConfig()))
    assert spec == local


def test_exact_mode_probes_the_split_itself(servers, model_path):
    target = str(model_path("smollm2-135m"))
    local, _ = _run(EngineConfig(target=target, proposer="none", kernel=KernelConfig(repack=False)), 24)
    eng = Engine.from_config(EngineConfig(target=target, proposer="ngram+suffix", exact=True,
                                          rpc=servers, n_gpu_layers=10, tensor_split=(1, 3)))
    try:
        assert eng.target.n_gpu_layers == 10 and eng.target.placement.endswith("layers=10;split=0.25,0.75")
        assert eng.exact_max_draft() >= 1  # measured on this placement, not read from the local one
        out = eng.generate(PROMPT, GenerationParams(max_tokens=24)).text
    finally:
        eng.close()
    assert out == local


def test_plan_shows_what_each_server_holds(servers, model_path):
    target = str(model_path("smollm2-135m"))
    res = CliRunner().invoke(cli, ["plan", "--target", target, "--proposer", "ngram",
                                   "--rpc", ",".join(servers), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    devs = d["rpc"]["devices"]
    assert [x["device"] for x in devs] == [f"{s}#0" for s in servers]
    assert sum(len(x["blocks"]) for x in devs) == 30 and devs[1]["output"]
    assert all(0 < x["bytes"] < x["free"] for x in devs)
    # the host no longer holds the offloaded weights and KV
    items = {i["name"]: i for i in d["memory"]["items"]}
    assert items["target KV cache"]["host"] == 0 and items["target KV cache"]["device"] > 0


def test_an_unreachable_server_is_an_error_not_a_crash(model_path):
    target = str(model_path("smollm2-135m"))
    port = _free_port()
    proc = subprocess.run(_edgespec() + ["generate", "--target", target, "--proposer", "none",
                                         "--rpc", f"127.0.0.1:{port}", "--max-tokens", "4"],
                          input="hi", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr  # not SIGABRT from llama.cpp
    assert f"cannot connect to RPC server 127.0.0.1:{port}" in proc.stderr
    assert f"edgespec rpc-server --host 127.0.0.1 --port {port}" in proc.stderr


def test_rpc_server_refuses_what_it_cannot_serve_safely(servers):
    busy = servers[0].rpartition(":")[2]
    for args, says in ((["--host", "0.0.0.0"], "--allow-remote"),
                       (["--port", busy], "cannot listen")):
        proc = subprocess.run(_edgespec() + ["rpc-server", *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ})
        assert proc.returncode == 1 and says in proc.stderr, proc.stderr


@pytest.mark.slow
def test_llama_cpps_own_rpc_server_serves_the_split(model_path):
    """llama.cpp's RPC server tool (`ggml-rpc-server`, built by `make anchors`; slow tier)
    speaks the same protocol: a split onto it gives the local greedy output too."""
    from edgespec.lab.bench.anchors.paths import anchors_bin_dir
    exe = anchors_bin_dir() / "ggml-rpc-server"
    assert exe.is_file(), f"{exe} is missing: run `make anchors`"
    port = _free_port()
    proc = subprocess.Popen([str(exe), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                rpc.probe(f"127.0.0.1:{port}", timeout=2)
                break
            except rpc.RpcError:
                time.sleep(0.2)
        target = str(model_path("smollm2-135m"))
        local, _ = _run(EngineConfig(target=target, proposer="none",
                                     kernel=KernelConfig(repack=False)), 24)
        split, where = _run(EngineConfig(target=target, proposer="none",
                                         rpc=(f"127.0.0.1:{port}",), n_gpu_layers=16), 24)
        assert where["layers"] == 16 and split == local
    finally:
        proc.terminate()
        proc.wait(10)
