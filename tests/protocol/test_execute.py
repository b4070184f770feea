"""What the protocol core adds for edgespec.apps (llama-cpp-python's Llama on the core):
execute() after planning with a hook on the engine's events, CoreRequest.logits_processor
(the plain path), and llama-cpp-python's unbounded logit_bias."""
from __future__ import annotations

import math

import pytest
from fakes import FakeModel, ScriptedProposer
from fakes.engine import fake_engine

from edgespec.api.events import Event, Finished, Step
from edgespec.api.params import GenerationParams
from edgespec.control import ControlSettings
from edgespec.protocol import ChoiceDone, CoreRequest, ProtocolError, TextDelta, engine_input, execute
from edgespec.protocol import limits


@pytest.fixture
def engine():
    return fake_engine(FakeModel())


def test_unbounded_logit_bias_takes_any_finite_number_and_minus_inf():
    assert limits.logit_bias({"3": -math.inf, "7": 250.0}, 50, bound=None) == \
        ((3, -math.inf), (7, 250.0))
    for bad in (math.nan, math.inf, "1", True):
        with pytest.raises(ProtocolError, match="finite number or -inf"):
            limits.logit_bias({"3": bad}, 50, bound=None)
    with pytest.raises(ProtocolError, match=r"\[-100, 100\]"):  # the server's bound stays
        limits.logit_bias({"3": 250.0}, 50)


def test_execute_runs_the_plan_and_wrap_sees_the_engine_events(engine):
    req = CoreRequest(None, GenerationParams(max_tokens=5), prompt="a b c", origins=True)
    seen: list[Event] = []

    def wrap(events):
        for ev in events:
            seen.append(ev)
            yield ev

    evs = list(execute(engine, req, engine_input(engine, req, "fake"), wrap=wrap))
    done = evs[-1]
    assert isinstance(done, ChoiceDone) and done.completion_tokens == 5
    assert any(isinstance(e, Step) for e in seen) and isinstance(seen[-1], Finished)
    deltas = [e for e in evs if isinstance(e, TextDelta)]
    assert "".join(e.text for e in deltas) == done.text
    assert sum(len(e.tokens) for e in deltas) == 5  # origins: one piece per token


def test_closing_execute_frees_the_engine(engine):
    req = CoreRequest(None, GenerationParams(max_tokens=50), prompt="a b c")
    events = execute(engine, req, engine_input(engine, req, "fake"))
    next(events)
    assert engine._lock.locked()
    events.close()
    assert not engine._lock.locked()


def test_a_logits_processor_reaches_the_engine_and_runs_on_the_plain_path():
    model = FakeModel()
    # a proposer that always drafts 2 tokens, so that "no drafts" is the processor's doing
    engine = fake_engine(model, {"scripted": ScriptedProposer(model, [2] * 50)},
                         control=ControlSettings(adaptive=False, max_draft=2))
    calls = []

    def processor(input_ids, scores):
        calls.append(len(input_ids))
        return scores

    def done(**kw):
        req = CoreRequest(None, GenerationParams(max_tokens=6), prompt="a b c", **kw)
        evs = list(execute(engine, req, engine_input(engine, req, "fake")))
        assert isinstance(evs[-1], ChoiceDone) and evs[-1].completion_tokens == 6
        return evs[-1]

    assert done().stats.drafted > 0
    assert done(logits_processor=processor).stats.drafted == 0
    assert len(calls) == 6  # once per generated token
