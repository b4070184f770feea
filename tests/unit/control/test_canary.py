"""The canary: a fraction of each traffic slice's requests runs the plain path, and the
goodput guard switches speculation off for a slice where it does not pay (and back on
when probes show a gain). Hermetic: the fake backend, with a virtual clock that charges
each target pass by its size, so decode rates are exact and the test is deterministic.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import edgespec.loop.request as request_mod
from edgespec.control import ControlSettings, GoodputGuard
from edgespec.control.guard import CanarySettings, Route, goodput, ratio_bound
from edgespec.errors import InvalidInputError
from edgespec.api.events import Control, Finished, RequestStarted
from edgespec.api.params import GenerationParams
from fakes import FakeModel, ScriptedProposer, fake_engine, fixed

STEP = 0.01  # seconds of a one-token target pass
PER_TOKEN = 0.3  # each further token in a pass costs this fraction of a step


class Clock:
    """perf_counter for the request loop; the fake context advances it on every decode."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t

    def on_decode(self, ctx, tokens, pos0) -> None:
        self.t += STEP * (1 + PER_TOKEN * (len(tokens) - 1))


@pytest.fixture
def clocked(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(request_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


def engine_with(clock, canary: CanarySettings):
    model = FakeModel()
    props = {"good": ScriptedProposer(model, [3], name="good"),  # every draft token right
             "bad": ScriptedProposer(model, [(0, 3)], name="bad")}  # every draft token wrong
    eng = fake_engine(model, props, control=fixed(3))
    eng.ctx.on_decode = clock.on_decode
    eng.guard.configure_canary(canary)
    return eng, props


def serve(eng, proposer: str, traffic: str, n: int) -> list[list]:
    out = []
    for _ in range(n):
        out.append(list(eng.stream("a", GenerationParams(max_tokens=24, chat=False),
                                   proposer=proposer, traffic=traffic)))
    return out


def started(events) -> RequestStarted:
    return next(e for e in events if isinstance(e, RequestStarted))


def controls(events, kind=None) -> list[Control]:
    return [e for e in events if isinstance(e, Control) and (kind is None or e.kind == kind)]


SETTINGS = CanarySettings(fraction=0.3, min_requests=6, window=32, probe_fraction=0.25, seed=7)


def test_canary_disables_a_bad_proposer_on_its_slice_and_keeps_a_good_one(clocked):
    eng, _ = engine_with(clocked, SETTINGS)
    chat = serve(eng, "bad", "chat", 60)
    code = serve(eng, "good", "code", 60)

    # the bad proposer's slice: switched off once, with the numbers in the event
    off = [c for evs in chat for c in controls(evs, "canary_off")]
    assert len(off) == 1 and "chat" in off[0].reason and "lower bound" in off[0].reason
    snap = eng.guard.canary_snapshot()
    assert snap["chat"]["enabled"] is False
    # one token per 4-token pass: about 1 / 1.9 of the plain rate (shorter drafts at the end)
    rate = float(re.search(r"decode at ([0-9.]+)x the plain canary", off[0].reason).group(1))
    assert 0.5 < rate < 0.6
    # after the switch most requests run plain, a fraction keeps probing
    i_off = next(i for i, evs in enumerate(chat) if controls(evs, "canary_off"))
    after = [started(evs).proposer for evs in chat[i_off + 1:]]
    assert after.count("none") > len(after) / 2 and "bad" in after
    assert all(controls(evs, "canary_held") for evs in chat[i_off + 1:]
               if started(evs).proposer == "none")

    # the good proposer's slice: never switched off, its improvement measured against the canary
    assert not [c for evs in code for c in controls(evs, "canary_off")]
    s = eng.guard.canary_snapshot()["code"]
    assert s["enabled"] is True and s["plain_requests"] >= 6
    assert s["improvement"] == pytest.approx(4 / 1.9, rel=0.1) and s["lower"] > 1.0


def test_canary_requests_run_the_plain_path_and_say_so(clocked):
    eng, props = engine_with(clocked, SETTINGS)
    runs = serve(eng, "good", "code", 30)
    canaries = [evs for evs in runs if controls(evs, "canary")]
    assert 3 <= len(canaries) <= 20  # about 30% of 30
    for evs in canaries:
        assert started(evs).proposer == "none"
        fin = evs[-1]
        assert isinstance(fin, Finished) and fin.stats.drafted == 0
        assert fin.stats.control_events["canary"] == 1
    # greedy output is the same on both arms
    texts = {evs[-1].text for evs in runs}
    assert len(texts) == 1


def test_a_slice_switched_off_comes_back_when_probes_show_a_gain(clocked):
    eng, props = engine_with(clocked, SETTINGS)
    chat = serve(eng, "bad", "chat", 40)
    assert any(controls(evs, "canary_off") for evs in chat)
    props["bad"].script = [3]  # the proposer got better (a new draft model, say)
    again = serve(eng, "bad", "chat", 120)
    on = [c for evs in again for c in controls(evs, "canary_on")]
    assert len(on) == 1 and "probes" in on[0].reason
    assert eng.guard.canary_snapshot()["chat"]["enabled"] is True


def test_without_canary_settings_requests_run_as_asked(clocked):
    model = FakeModel()
    eng = fake_engine(model, {"bad": ScriptedProposer(model, [(0, 3)], name="bad")},
                      control=fixed(3))
    runs = serve(eng, "bad", "default", 10)
    assert all(started(evs).proposer == "bad" and not controls(evs) for evs in runs)
    assert eng.guard.canary_snapshot() == {}


# --- the guard's routing and estimator on literal numbers ------------------------------------
def test_route_draws_the_configured_fraction_and_never_touches_the_plain_path():
    g = GoodputGuard(ControlSettings())
    assert g.route("x", "ngram") == Route("ngram", "direct")
    g.configure_canary(CanarySettings(fraction=0.2, seed=1))
    arms = [g.route("x", "ngram").arm for _ in range(2000)]
    assert arms.count("canary") / 2000 == pytest.approx(0.2, abs=0.03)
    assert set(arms) == {"canary", "speculative"}
    assert g.route("x", "none").arm == "direct"


def test_one_estimator_for_steps_and_requests():
    # a plain baseline of 100 tok/s and a speculative one of 150 tok/s, both exact
    spec = goodput([(15, 0.1), (30, 0.2)])
    plain = goodput([(10, 0.1), (20, 0.2)])
    speedup, lower = ratio_bound(spec, plain, 1.645)
    assert speedup == pytest.approx(1.5) and lower == pytest.approx(1.5)
    noisy = goodput([(10, 0.1), (30, 0.1), (20, 0.1)])
    s2, l2 = ratio_bound(noisy, plain, 1.645)
    assert s2 == pytest.approx(2.0) and l2 < s2


def test_requests_of_one_token_or_none_are_no_evidence():
    g = GoodputGuard(ControlSettings())
    g.configure_canary(CanarySettings(fraction=0.5, min_requests=2, seed=0))
    r = Route("ngram", "speculative")
    assert g.observe_request("x", r, 0, 0.0) is None
    assert g.observe_request("x", r, 5, 0.0) is None
    assert g.canary_snapshot() == {}


@pytest.mark.parametrize("bad", [dict(fraction=0.0), dict(fraction=1.0), dict(probe_fraction=0),
                                 dict(min_requests=1), dict(window=4, min_requests=8)])
def test_canary_settings_are_checked(bad):
    with pytest.raises(InvalidInputError, match="canary"):
        CanarySettings(**bad).validate()
