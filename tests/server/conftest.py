"""Real `edgespec serve` processes on loopback (smollm2-135m: small, with a chat template),
started once per session and driven with the real openai client and with raw HTTP."""
from __future__ import annotations

import pytest
from server_env import API_KEY, FIM_MODEL, MODEL, base_args

from tools.soak import ServeProcess


@pytest.fixture(scope="session")
def server(model_path):
    """The main server: four sequences batched in exact mode (greedy output equals the
    plain path's, alone or under concurrency), the free proposers, 8 queued requests."""
    model_path(MODEL)  # pulled before the server needs it
    with ServeProcess(base_args("--proposer", "ngram+suffix", "--exact", "--parallel", "4",
                                "--max-queue", "8", "--max-tokens-limit", "512")) as s:
        yield s


@pytest.fixture(scope="session")
def keyed_server(model_path):
    """An API key, one sequence and no queue (the second request is refused with 429)."""
    model_path(MODEL)
    with ServeProcess(base_args("--proposer", "none", "--api-key", API_KEY, "--parallel", "1",
                                "--max-queue", "0", "--max-tokens-limit", "300")) as s:
        yield s


@pytest.fixture
def client(server):
    from openai import OpenAI
    with OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0,
                timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def dialect_server(model_path):
    """Ollama's and llama-server's native APIs (test_ollama, test_llamacpp_native): the
    free proposers on smollm2-135m (no FIM tokens, no tool template) with qwen-0.5b beside
    it (FIM tokens, tools; loaded on its first request), and an Ollama listener on a port
    of its own (``ollama_url``)."""
    model_path(MODEL)
    model_path(FIM_MODEL)
    with ServeProcess(base_args("--proposer", "ngram+suffix", "--parallel", "2",
                                "--max-tokens-limit", "512", "--extra-model", FIM_MODEL,
                                "--ollama-port", "0")) as s:
        line = next(l for l in s.log if "Ollama API on" in l)
        s.ollama_url = line.rsplit(" ", 1)[1].strip()
        yield s
