"""Several models behind one real `edgespec serve` (smollm2-135m as the target, gemma-270m
beside it), driven with the real openai client and raw HTTP: /v1/models lists exactly what
can be requested with its state, a model loads on its first request, idle models unload
after the keep-alive or to make room, and a model that cannot fit is refused naming what
is busy."""
from __future__ import annotations

import json
import threading
import time

import openai
import pytest
from server_env import COUNTING, MODEL, base_args
from test_server_limits import long_stream

from tools.soak import ServeProcess

OTHER = "gemma-270m"
GREEDY = {"temperature": 0.0}


def states(server) -> dict[str, str]:
    status, _, body = server.request("GET", "/v1/models")
    assert status == 200, body
    return {m["id"]: m["state"] for m in json.loads(body)["data"]}


def wait_state(server, model: str, state: str, timeout: float = 20.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        s = states(server)
        if s[model] == state or time.monotonic() > deadline:
            return s
        time.sleep(0.2)


def client_for(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def two(model_path):
    """Both models fit; an idle one is unloaded after 2 s."""
    model_path(MODEL), model_path(OTHER)
    with ServeProcess(base_args("--proposer", "ngram+suffix", "--extra-model", OTHER,
                                "--extra-model", f"smol2={MODEL}", "--keep-alive", "2")) as s:
        yield s


def test_two_models_load_on_first_request_and_each_answers_as_itself(two):
    with client_for(two) as c:
        listed = c.models.list().data
        assert [m.id for m in listed] == [MODEL, OTHER, "smol2"]
        assert states(two)[OTHER] == "unloaded"
        assert not c.models.retrieve(OTHER).model_extra["loaded"]
        a = c.completions.create(model=MODEL, prompt=COUNTING, max_tokens=8, **GREEDY)
        b = c.completions.create(model=OTHER, prompt=COUNTING, max_tokens=8, **GREEDY)
        assert a.model == MODEL and b.model == OTHER
        ida, idb = a.model_extra["edgespec"]["identity"], b.model_extra["edgespec"]["identity"]
        assert ida != idb  # two engines, two release identities
        gemma = c.models.retrieve(OTHER).model_extra
        assert gemma["loaded"] and gemma["state"] == "loaded" and gemma["identity"] == idb
        assert gemma["edgespec"]["target"] == OTHER
        # the same file under another id is a model of its own
        s = c.completions.create(model="smol2", prompt=COUNTING, max_tokens=8, **GREEDY)
        assert s.choices[0].text == a.choices[0].text


def test_concurrent_requests_to_two_models_are_served_by_their_own_engines(two):
    out: dict[str, str] = {}
    errors: list[BaseException] = []

    def ask(model: str) -> None:
        try:
            with client_for(two) as c:
                r = c.completions.create(model=model, prompt=COUNTING, max_tokens=24,
                                         **GREEDY)
                out[model] = r.model
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=ask, args=(m,)) for m in (MODEL, OTHER, MODEL)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert out == {MODEL: MODEL, OTHER: OTHER}


def test_an_idle_model_is_unloaded_after_the_keep_alive_and_loads_again(two):
    with client_for(two) as c:
        c.completions.create(model=OTHER, prompt=COUNTING, max_tokens=4, **GREEDY)
        assert states(two)[OTHER] == "loaded"
        assert wait_state(two, OTHER, "unloaded")[OTHER] == "unloaded"
        again = c.completions.create(model=OTHER, prompt=COUNTING, max_tokens=4, **GREEDY)
        assert again.model == OTHER and again.choices[0].text


def test_an_unknown_model_is_a_404_naming_the_served_ones(two):
    with client_for(two) as c:
        with pytest.raises(openai.NotFoundError) as e:
            c.completions.create(model="qwen-1.5b", prompt="x", max_tokens=2)
    err = e.value.body
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert MODEL in err["message"] and OTHER in err["message"]


def test_a_model_that_does_not_fit_beside_a_busy_one_is_refused_naming_it(model_path):
    """700 MiB holds either model (285 MB, 513 MB by the planner) but not both: an idle
    target is unloaded to make room (least recently used); a busy one is not."""
    model_path(MODEL), model_path(OTHER)
    with ServeProcess(base_args("--proposer", "none", "--budget", "700MiB", "--extra-model", OTHER,
                                "--max-tokens-limit", "512")) as s:
        status, _, body = s.request("POST", "/v1/completions", {
            "model": OTHER, "prompt": COUNTING, "max_tokens": 4, "temperature": 0.0})
        assert status == 200, body
        assert states(s) == {MODEL: "unloaded", OTHER: "loaded"}  # the idle target made room
        # now keep gemma busy with a long stream and ask for the target
        conn, _ = long_stream(s, max_tokens=512, model=OTHER)
        try:
            status, headers, body = s.request("POST", "/v1/completions", {
                "model": MODEL, "prompt": COUNTING, "max_tokens": 4})
            err = json.loads(body)["error"]
            assert status == 503 and err["code"] == "insufficient_memory", body
            assert OTHER in err["message"] and "budget" in err["message"]
            assert headers.get("retry-after") or headers.get("Retry-After")
        finally:
            conn.close()
        s.wait_idle(30)
        status, _, body = s.request("POST", "/v1/completions", {
            "model": MODEL, "prompt": COUNTING, "max_tokens": 4, "temperature": 0.0})
        assert status == 200, body  # once gemma is idle it makes room in turn
        assert states(s) == {MODEL: "loaded", OTHER: "unloaded"}


def test_serve_refuses_a_model_it_cannot_resolve_before_loading_anything(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "from edgespec.cli import main; main()", "serve",
                        "--port", "0", *base_args("--extra-model", str(tmp_path / "missing.gguf"))],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "missing.gguf" in r.stderr and "Traceback" not in r.stderr
