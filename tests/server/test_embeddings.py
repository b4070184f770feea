"""Embeddings on `edgespec serve`: OpenAI's /v1/embeddings through the real openai client,
Ollama's /api/embed and /api/embeddings through the real ollama client, raw HTTP for the
refusals; the parsing and rendering as pure functions with literal values."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from server_env import COUNTING, MODEL

from edgespec.protocol.errors import ProtocolError
from edgespec.server.dialects import embeddings as wire

N_EMBD = 576  # SmolLM2-135M's hidden size


# --- pure: parsing and rendering ------------------------------------------------------------
class _Out:
    def __init__(self, vectors, n_tokens):
        self.vectors = tuple(np.asarray(v, dtype=np.float32) for v in vectors)
        self.n_tokens = n_tokens


def test_openai_inputs_take_every_form():
    assert wire.openai_inputs("hi") == ["hi"]
    assert wire.openai_inputs(["a", "b"]) == ["a", "b"]
    assert wire.openai_inputs([1, 2, 3]) == [[1, 2, 3]]  # one token-id input
    assert wire.openai_inputs([[1, 2], [3]]) == [[1, 2], [3]]
    assert wire.openai_inputs(["a", [4, 5]]) == ["a", [4, 5]]
    for bad in ([], [[]], [True], [1.5], {"a": 1}, None, ["a", None]):
        with pytest.raises(ProtocolError) as e:
            wire.openai_inputs(bad)
        assert e.value.status == 400 and e.value.param == "input"


def test_openai_fields_are_checked():
    req = wire.parse_openai({"input": "x"})
    assert req == {"model": None, "inputs": ["x"], "pooling": "model",
                   "encoding_format": "float", "dimensions": None}
    assert wire.parse_openai({"input": "x", "pooling": "cls"})["pooling"] == "cls"
    for body, param in (({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": "x", "dimensions": 0}, "dimensions"),
                        ({"input": "x", "pooling": "none"}, "pooling"),
                        ({"input": "x", "model": 3}, "model"),
                        ({"model": "m"}, "input")):
        with pytest.raises(ProtocolError) as e:
            wire.parse_openai(body)
        assert (e.value.status, e.value.param) == (400, param)


def test_render_openai_float_and_base64():
    out = _Out([[0.5, -0.25], [1.0, 0.0]], 7)
    whole = wire.render_openai(out, "m")
    assert whole == {"object": "list", "model": "m",
                     "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]},
                              {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]}],
                     "usage": {"prompt_tokens": 7, "total_tokens": 7}}
    b64 = wire.render_openai(out, "m", "base64")["data"][1]["embedding"]
    assert np.frombuffer(base64.b64decode(b64), dtype="<f4").tolist() == [1.0, 0.0]
    assert wire.render_openai(out, "m", dimensions=2)["data"][0]["index"] == 0
    with pytest.raises(ProtocolError) as e:
        wire.render_openai(out, "m", dimensions=1)
    assert e.value.param == "dimensions"


def test_parse_ollama():
    assert wire.parse_ollama({"model": "m", "input": ["a", "b"]}, legacy=False) == {
        "model": "m", "inputs": ["a", "b"], "truncate": True, "pooling": "model"}
    assert wire.parse_ollama({"model": "m", "prompt": "a"}, legacy=True)["inputs"] == ["a"]
    for body, legacy in (({"input": "a"}, False), ({"model": "m", "input": []}, False),
                         ({"model": "m", "input": [""]}, False),
                         ({"model": "m", "prompt": ""}, True),
                         ({"model": "m", "input": "a", "truncate": "yes"}, False)):
        with pytest.raises(ProtocolError):
            wire.parse_ollama(body, legacy)


# --- the real server ------------------------------------------------------------------------
def _norm(v) -> float:
    return float(np.linalg.norm(np.asarray(v, dtype=np.float64)))


def test_openai_client_embeds(client):
    one = client.embeddings.create(model=MODEL, input="The quick brown fox")
    assert one.object == "list" and one.model == MODEL and len(one.data) == 1
    vec = one.data[0].embedding  # the client asked for base64 and decoded it
    assert len(vec) == N_EMBD and abs(_norm(vec) - 1.0) < 1e-4
    assert one.usage.prompt_tokens == one.usage.total_tokens > 0

    many = client.embeddings.create(model=MODEL, input=["The quick brown fox", "Bonjour"],
                                    encoding_format="float")
    assert [d.index for d in many.data] == [0, 1]
    np.testing.assert_allclose(many.data[0].embedding, vec, atol=1e-5)  # same text, same vector
    assert float(np.dot(many.data[0].embedding, many.data[1].embedding)) < 0.999

    ids = client.embeddings.create(model=MODEL, input=[[504, 2365, 6354], [504]])
    assert len(ids.data) == 2 and ids.usage.prompt_tokens == 4


def test_poolings_differ_and_cls_is_a_token_state(server):
    def embed(pooling):
        r = httpx.post(server.base_url + "/v1/embeddings", timeout=60,
                       json={"input": "Hello world, a test", "pooling": pooling})
        assert r.status_code == 200, r.text
        return np.array(r.json()["data"][0]["embedding"])

    mean, cls, last = embed("mean"), embed("cls"), embed("last")
    np.testing.assert_allclose(embed("model"), mean, atol=1e-6)  # a generative model: mean
    assert np.abs(mean - cls).max() > 1e-3 and np.abs(cls - last).max() > 1e-3


def test_openai_refusals(server):
    url = server.base_url + "/v1/embeddings"

    def post(body):
        return httpx.post(url, json=body, timeout=60)

    r = post({"model": "no-such-model", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = post({"model": MODEL, "input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = post({"model": MODEL, "input": "x", "dimensions": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    r = post({"model": MODEL, "input": [[10 ** 9]]})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    r = post({"model": MODEL, "input": "word " * 3000})  # past the 1024-token context
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded", err
    assert err["param"] == "input"
    r = httpx.post(url, content=b"{not json", timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_ollama_client_embeds(server):
    ollama = pytest.importorskip("ollama")
    c = ollama.Client(host=server.base_url, timeout=60)
    out = c.embed(model=MODEL, input=["The quick brown fox", "Bonjour"])
    assert len(out.embeddings) == 2 and all(len(v) == N_EMBD for v in out.embeddings)
    assert all(abs(_norm(v) - 1.0) < 1e-4 for v in out.embeddings)
    assert out.prompt_eval_count > 0 and out.total_duration >= out.load_duration >= 0
    legacy = c.embeddings(model=MODEL, prompt="The quick brown fox")
    assert len(legacy.embedding) == N_EMBD
    # the legacy route does not normalise; the same direction as /api/embed's unit vector
    unit = np.asarray(legacy.embedding) / _norm(legacy.embedding)
    np.testing.assert_allclose(unit, out.embeddings[0], atol=1e-4)
    with pytest.raises(ollama.ResponseError) as e:
        c.embed(model="no-such-model", input="x")
    assert e.value.status_code == 404


def test_ollama_refusals_are_ollama_shaped(server):
    r = httpx.post(server.base_url + "/api/embed", json={"model": MODEL, "input": 3}, timeout=60)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = httpx.post(server.base_url + "/api/embed", timeout=60,
                   json={"model": MODEL, "input": "word " * 3000, "truncate": False})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    # truncated to the context and served (1024 tokens in one pass: minutes on a busy CPU)
    r = httpx.post(server.base_url + "/api/embed", timeout=600,
                   json={"model": MODEL, "input": "word " * 1100})
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == 1024


def test_generation_is_undisturbed_by_embeddings(client):
    def greedy():
        return client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=12,
                                         temperature=0).choices[0].text

    before = greedy()
    client.embeddings.create(model=MODEL, input=[COUNTING, "something else entirely"])
    assert greedy() == before
