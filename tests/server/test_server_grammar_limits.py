"""One request's grammar can neither crash a real `edgespec serve` nor pin its memory
(issue #43 items 1 and 2).

Before the bounds, a response_format schema with maxLength 20000 (or a pattern a{0,20000})
killed the server with SIGSEGV within 0.2 s, and each distinct schema with minLength 10**7
kept ~95 MB in the compiled-grammar cache (six requests: RSS 207 -> 758 MiB).
"""
from __future__ import annotations

import json

import pytest
from server_env import MODEL, base_args

from edgespec.grammar.bounds import LIMITS
from edgespec.grammar.constraint import CACHE_BUDGET
from tools.soak import ServeProcess


@pytest.fixture(scope="module")
def server(model_path):
    """A server of its own (its RSS is measured): the plain path, nothing to calibrate."""
    model_path(MODEL)
    with ServeProcess(base_args("--proposer", "none", "--parallel", "1")) as s:
        yield s


def _chat(server, schema: dict, max_tokens: int = 1) -> tuple[int, dict]:
    status, _, body = server.request("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "t", "schema": schema}}})
    return status, json.loads(body)


def _assert_alive(server) -> None:
    assert server.proc.poll() is None, "".join(server.log[-30:])
    status, reply = _chat(server, {"type": "object", "properties": {"a": {"type": "integer"}},
                                   "required": ["a"]}, max_tokens=2)
    assert status == 200, reply


@pytest.mark.parametrize("string", [{"maxLength": 20000}, {"maxLength": 100000},
                                    {"pattern": "^a{0,20000}$"}])
def test_a_crashing_schema_is_400_grammar_too_complex(server, string):
    status, reply = _chat(server, {"type": "object", "required": ["s"],
                                   "properties": {"s": {"type": "string", **string}}})
    err = reply["error"]
    assert status == 400 and err["code"] == "grammar_too_complex", reply
    assert "max_schema_repeat" in err["message"] and "20,000" in err["message"] or \
        "100,000" in err["message"]
    _assert_alive(server)


def test_a_crashing_grammar_is_400_on_the_native_endpoint(server):
    deep = "root ::= " + "(" * 30000 + '"a"' + ")" * 30000
    status, _, body = server.request("POST", "/completion", {
        "prompt": "x", "n_predict": 1, "grammar": deep})
    reply = json.loads(body)  # llama-server's error shape: its `code` is the status
    assert status == 400 and reply["error"]["code"] == 400, reply
    assert "too complex" in reply["error"]["message"]
    assert "max_depth" in reply["error"]["message"]
    _assert_alive(server)


def test_heavy_schemas_stay_within_the_memory_budget(server):
    """Distinct heavy schemas: the refused ones cost nothing kept, the accepted ones (each
    near the per-grammar limits) are kept within CACHE_BUDGET in all."""
    _assert_alive(server)  # warm: the model's first grammar and its buffers
    before = server.rss()
    for i in range(6):  # the reproduction: ~95 MB each before
        status, reply = _chat(server, {"type": "string", "minLength": 10 ** 7 + i})
        assert status == 400 and reply["error"]["code"] == "grammar_too_complex", reply
    for i in range(8):  # accepted, each ~100 KB of schema and ~100 KB of grammar
        values = [f"{i}-{j}-" + "v" * 160 for j in range(500)]
        status, reply = _chat(server, {"enum": values})
        assert status == 200, reply
    _assert_alive(server)
    grown = server.rss() - before
    # the cache's budget, plus what one request's grammar holds while it runs (its sampler
    # and a clone per verified draft: max_elements x 8 bytes each) and allocator slack
    allowance = CACHE_BUDGET + 8 * LIMITS.max_elements * 8 + 32 * 2 ** 20
    assert grown <= allowance, f"RSS grew {grown / 2**20:.0f} MiB (allowed " \
                               f"{allowance / 2**20:.0f} MiB)"
