"""The app without a model: the fake backend's engine, and a stub scheduler that records what
reaches it and plays back chosen events (Starlette's TestClient, in process, milliseconds)."""
from __future__ import annotations

import json
import threading

import pytest
from fakes import FakeModel
from fakes.engine import fake_engine
from starlette.testclient import TestClient

from edgespec.errors import ContextOverflowError, UnsupportedError
from edgespec.api.events import Finished, Step
from edgespec.server import ServerSettings, create_app
from edgespec.server.auth import check
from edgespec.server.errors import APIError
from edgespec.serving import DONE, QueueLoad, QueueFullError, Scheduler
from edgespec.serving.tickets import ShuttingDownError
from edgespec.api.stats import RequestStats

MSG = [{"role": "user", "content": "a b c"}]


class StubScheduler:
    def __init__(self, events=(), error: Exception | None = None) -> None:
        self.events = list(events)
        self.error = error
        self.calls: list[tuple] = []
        self.cancelled = 0

    def submit(self, prompt, params, *, on_event, **kw):
        self.calls.append((prompt, params.validate(), kw))
        if self.error is not None:
            raise self.error
        threading.Thread(target=lambda: [on_event(e) for e in [*self.events, DONE]]).start()
        stub = self

        class Ticket:
            def cancel(self):
                stub.cancelled += 1
        return Ticket()

    def load(self) -> QueueLoad:
        return QueueLoad(0, 0, 1, 4)

    def close(self, drain: bool = True) -> None:
        pass


def finished(text="ok", tokens=(3, 4), reason="eos") -> Finished:
    stats = RequestStats(prompt_tokens=5, generated_tokens=len(tokens), stop_reason=reason)
    return Finished(1, text, tuple(tokens), reason, stats)


@pytest.fixture
def engine():
    return fake_engine(FakeModel())


def app_client(scheduler, engine, **settings):
    app = create_app(scheduler, engine, ServerSettings(served_model="fake", **settings))
    return TestClient(app)


def post(c, path, body, **kw):
    return c.post(path, content=body if isinstance(body, bytes) else json.dumps(body), **kw)


def test_request_fields_reach_the_scheduler_as_generation_params(engine):
    sched = StubScheduler([finished()])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    with app_client(sched, engine) as c:
        r = post(c, "/v1/chat/completions", {
            "model": "fake", "max_completion_tokens": 7, "top_p": 0.5, "seed": 3,
            "stop": ["x"], "logit_bias": {"5": -100}, "logprobs": True, "top_logprobs": 3,
            "presence_penalty": 0.5, "top_k": 4,
            "messages": [{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "t", "schema": schema}}})
        assert r.status_code == 200, r.text
        prompt, p, _ = sched.calls[-1]
        assert prompt == [{"role": "system", "content": "be brief"},
                          {"role": "user", "content": "a\nb"}]
        assert (p.max_tokens, p.stop, p.chat, p.logprobs, p.json_schema) == \
            (7, ("x",), True, 3, schema)
        s = p.sampling
        assert (s.temperature, s.top_p, s.seed, s.logit_bias, s.presence_penalty, s.top_k) == \
            (1.0, 0.5, 3, ((5, -100.0),), 0.5, 4)  # OpenAI's default temperature

        r = post(c, "/v1/completions", {"model": "fake", "prompt": ["one prompt"],
                                        "temperature": 0, "logprobs": 2})
        prompt, p, _ = sched.calls[-1]
        assert r.status_code == 200 and prompt == "one prompt"
        assert (p.chat, p.logprobs, p.sampling.greedy, p.max_tokens) == (False, 2, True, 4096)
        post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG,
                                         "response_format": {"type": "json_object"}})
        assert sched.calls[-1][1].json_mode is True


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]},
     "messages.0.tool_call_id"),  # it answers no call
    ({"messages": MSG, "functions": [{"name": "f"}]}, "functions"),
    ({"messages": MSG, "tool_choice": "auto"}, "tool_choice"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": MSG, "response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ({"messages": MSG, "temperature": 3}, "temperature"),
    ({"messages": MSG, "stop": 5}, "stop"),
    ({"messages": MSG, "seed": -5}, "seed"),
])
def test_chat_refusals_name_the_field(engine, body, param):
    sched = StubScheduler([finished()])
    with app_client(sched, engine) as c:
        r = post(c, "/v1/chat/completions", {"model": "fake", **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        assert sched.calls == []  # refused before the scheduler saw it


@pytest.mark.parametrize("body,param", [
    ({"prompt": []}, "prompt"), ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": [1, 2, 10**9]}, "prompt"), ({"prompt": "a", "best_of": 2}, "best_of"),
    ({"prompt": ["a", "b"] * 9}, "prompt"), ({"prompt": "a", "logprobs": 21}, "logprobs"),
    ({"prompt": "a", "suffix": "z"}, "suffix"),  # the fake model has no FIM tokens
])
def test_completion_refusals_name_the_field(engine, body, param):
    with app_client(StubScheduler([finished()]), engine) as c:
        r = post(c, "/v1/completions", {"model": "fake", **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param


@pytest.mark.parametrize("error,status,code", [
    (QueueFullError("full", retry_after=2.3), 429, "queue_full"),
    (ShuttingDownError("closing"), 503, "shutting_down"),
    (ContextOverflowError("too long"), 400, "context_length_exceeded"),
    (UnsupportedError("no"), 400, "unsupported_parameter"),
])
def test_scheduler_refusals_map_to_statuses(engine, error, status, code):
    with app_client(StubScheduler(error=error), engine) as c:
        r = post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG})
        assert r.status_code == status and r.json()["error"]["code"] == code
        if status == 429:
            assert r.headers["retry-after"] == "3"
        assert f'edgespec_requests_rejected_total{{code="{code}",status="{status}"}} 1.0' \
            in c.get("/metrics").text


def test_a_failure_while_running_is_a_500_or_a_stream_error_and_the_server_goes_on(engine):
    sched = StubScheduler([RuntimeError("boom")])
    with app_client(sched, engine, max_tokens_limit=64) as c:
        r = post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        r = post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG, "stream": True})
        data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert json.loads(data[-1])["error"]["type"] == "server_error"
        assert "edgespec_requests_failed_total 2.0" in c.get("/metrics").text
        sched.events = [Step(1, (3,), "hi", ("target",), None, 0, 0, 0.0, 0.0, 0.01),
                        finished("hi", (3,))]
        r = post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"


def test_streamed_text_ends_with_what_the_assembler_released_at_the_end(engine):
    # a held-back possible stop string is only in Finished.text: it must still be sent
    events = [Step(1, (3,), "ab", ("target",), None, 0, 0, 0.0, 0.0, 0.01),
              finished("ab:", (3, 4))]
    with app_client(StubScheduler(events), engine) as c:
        r = post(c, "/v1/completions", {"model": "fake", "prompt": "x", "stream": True})
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == "ab:"
        assert r.text.rstrip().endswith("data: [DONE]")


def test_fake_engine_round_trip_whole_and_streamed(engine):
    sched = Scheduler(engine, parallel=1, max_queue=4)
    with app_client(sched, engine) as c:
        # long enough that a greedy request, which reuses only what a prefill wrote and
        # computes at least 8 positions (edgespec.decoding.kvcache), reuses some of it
        long = [{"role": "user", "content": "a b c " * 8}]
        body = {"model": "fake", "messages": long, "max_tokens": 6, "temperature": 0}
        whole = post(c, "/v1/chat/completions", body).json()
        r = post(c, "/v1/chat/completions", {**body, "stream": True,
                                             "stream_options": {"include_usage": True}})
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks
                       if ch["choices"])
        assert text == whole["choices"][0]["message"]["content"]
        usage = chunks[-1]["usage"]
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert usage[k] == whole["usage"][k]
        # the second request reused the KV of the first one's prompt
        assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        assert whole["usage"]["completion_tokens"] == 6
        metrics = c.get("/metrics").text
        assert 'edgespec_requests_finished_total{stop_reason="length"} 2.0' in metrics
        assert "edgespec_generation_tokens_total 12.0" in metrics
        assert c.get("/health").json()["running"] == 0


def test_limits_and_routes_answer_openai_shaped(engine):
    with app_client(StubScheduler([finished()]), engine, max_body_bytes=2048) as c:
        r = post(c, "/v1/completions", {"model": "fake", "prompt": "x" * 4096})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        r = c.get("/v1/nothing")
        assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param",
                                                                   "code"}
        assert c.get("/v1/chat/completions").status_code == 405
        r = post(c, "/v1/completions", {"model": "other", "prompt": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_api_key_check():
    check(None, "/v1/models", None)  # no key configured: open
    check("k", "/health", None)  # probes are open
    check("k", "/v1/models", "Bearer k")
    check("k", "/v1/models", "bearer k")
    for header in (None, "", "k", "Bearer", "Bearer kk", "Basic k", "Bearer K"):
        with pytest.raises(APIError) as e:
            check("k", "/v1/models", header)
        assert e.value.status == 401 and e.value.code == "invalid_api_key"


def test_traffic_slices_reach_a_scheduler_that_takes_them(engine):
    class SlicedScheduler(StubScheduler):
        def submit(self, prompt, params, *, on_event, traffic="default", **kw):
            return super().submit(prompt, params, on_event=on_event, traffic=traffic, **kw)

    sched = SlicedScheduler([finished()])
    with app_client(sched, engine, max_slices=2) as c:
        post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG})
        post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG,
                                         "response_format": {"type": "json_object"}})
        post(c, "/v1/completions", {"model": "fake", "prompt": "x"})
        for name in ("code", "docs", "code"):
            r = post(c, "/v1/completions", {"model": "fake", "prompt": "x"},
                     headers={"X-Edgespec-Slice": name})
            assert r.status_code == 200
        assert [kw["traffic"] for _, _, kw in sched.calls] == \
            ["chat", "chat/json", "completion", "code", "docs", "code"]
        r = post(c, "/v1/completions", {"model": "fake", "prompt": "x"},
                 headers={"X-Edgespec-Slice": "third"})  # beyond max_slices new names
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_slices"


FIELDS = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
          "stream_options", "stop", "seed", "presence_penalty", "frequency_penalty",
          "logit_bias", "logprobs", "top_logprobs", "response_format", "top_k", "min_p",
          "repeat_penalty", "tools", "tool_choice", "user", "metadata", "messages", "model"]


def test_any_json_body_gets_an_answer_never_a_500(engine):
    """Random values for every field: each request is answered 200 or an OpenAI-shaped 4xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=False), st.text(max_size=8))
    values = st.recursive(scalars, lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=6), kids, max_size=3)),
        max_leaves=6)
    sched = StubScheduler([finished()])
    with app_client(sched, engine) as c:
        @settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(st.dictionaries(st.sampled_from(FIELDS), values, max_size=4))
        def check(fields):
            body = {"model": "fake", "messages": MSG, **fields}
            r = post(c, "/v1/chat/completions", body)
            assert r.status_code in (200, 400, 404), (body, r.text)
            if r.status_code != 200:
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        check()


def test_unknown_fields_are_ignored_unless_strict(engine, caplog):
    body = {"model": "fake", "messages": MSG, "mystery": 1, "store": True, "metadata": {}}
    with app_client(StubScheduler([finished()]), engine) as c:
        with caplog.at_level("WARNING", logger="edgespec.server"):
            assert post(c, "/v1/chat/completions", body).status_code == 200
    assert "mystery" in caplog.text
    with app_client(StubScheduler([finished()]), engine, strict=True) as c:
        r = post(c, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_parameter"


@pytest.mark.parametrize("extra", [
    {"stop": [str(i) for i in range(17)]}, {"stop": ""}, {"stream_options": {}},
    {"logit_bias": {"x": 1}}, {"logit_bias": {"1": 500}},
    {"top_logprobs": 2},
])
def test_every_refusal_has_a_documented_code(engine, extra):
    import pathlib
    import re
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "server.md").read_text()
    with app_client(StubScheduler([finished()]), engine) as c:
        r = post(c, "/v1/chat/completions", {"model": "fake", "messages": MSG, **extra})
    code = r.json()["error"]["code"]
    assert r.status_code == 400 and code and re.search(rf"`{code}`", doc)


def test_nan_temperature_is_not_a_number(engine):
    with app_client(StubScheduler([finished()]), engine) as c:
        r = post(c, "/v1/chat/completions",
                 b'{"model": "fake", "messages": [{"role": "user", "content": "a"}], '
                 b'"temperature": NaN}')
    assert r.status_code == 400 and "not a number" in r.json()["error"]["message"]


def test_cors_preflight_only_when_enabled(engine):
    pre = {"Origin": "http://app.test", "Access-Control-Request-Method": "POST"}
    with app_client(StubScheduler(), engine, cors_origins=("http://app.test",)) as c:
        r = c.options("/v1/chat/completions", headers=pre)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.test"
    with app_client(StubScheduler(), engine) as c:
        r = c.options("/v1/chat/completions", headers=pre)
    assert "access-control-allow-origin" not in r.headers
