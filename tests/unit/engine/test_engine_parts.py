"""The engine's parts, each with one job: the proposer set, what it measures once and keeps
(Upkeep), and a constructor that owns what it is handed from its first line."""
from __future__ import annotations

from contextlib import ExitStack

import pytest

from edgespec.calibration.curve import Calibration
from edgespec.config import EngineConfig
from edgespec.control import ControlSettings, GoodputGuard
from edgespec.engine.engine import Engine
from edgespec.engine.proposer_set import ProposerSet
from edgespec.engine.upkeep import Upkeep
from edgespec.errors import InvalidInputError
from edgespec.proposers import free_proposer
from fakes import FakeModel, fake_engine


class Closing:
    """A stand-in proposer that records its close."""

    costly = False
    name = "closing"

    def __init__(self, log: list[str], tag: str) -> None:
        self.log, self.tag = log, tag

    def close(self) -> None:
        self.log.append(self.tag)


def test_the_proposer_set_refuses_reserved_duplicate_and_unloaded_names():
    changes: list[int] = []
    with ExitStack() as stack:
        s = ProposerSet({"ngram": free_proposer("ngram")}, {}, stack,
                        on_change=lambda: changes.append(1))
        s.check("ngram")
        s.check("none")
        with pytest.raises(InvalidInputError, match="'suffix' is not loaded"):
            s.check("ngram+suffix")
        for bad in ("none", "auto", "a+b", "", "ngram"):
            with pytest.raises(InvalidInputError, match="already loaded or reserved"):
                s.add(bad, Closing([], bad))
        assert changes == []
        with pytest.raises(InvalidInputError, match="not an added proposer"):
            s.remove("ngram", keep="ngram")
        assert s.label() == "ngram"


def test_an_added_proposer_closes_with_the_set_or_when_removed():
    log: list[str] = []
    changes: list[int] = []
    with ExitStack() as stack:
        s = ProposerSet({}, {}, stack, on_change=lambda: changes.append(1))
        s.add("a", Closing(log, "a"))
        s.add("b", Closing(log, "b"))
        s.remove("a", keep="none")
        assert log == ["a"] and list(s.loaded) == ["b"] and changes == [1, 1, 1]
    assert log[1:] == ["b", "a"]  # the stack closes both (closing twice is harmless)


def test_a_clone_starts_from_the_options_its_kind_was_built_with():
    with ExitStack() as stack:
        s = ProposerSet({"suffix": free_proposer("suffix", factor=3.0)},
                        {"suffix": {"factor": 3.0}}, stack)
        name = s.clone("suffix", "cfg/suffix", {"min_token_prob": 0.2})
        clone = s.loaded[name]
        assert clone is not s.loaded["suffix"]
        assert (clone.factor, clone.min_token_prob) == (3.0, 0.2)
        with pytest.raises(InvalidInputError, match="not loaded"):
            s.clone("ngram", "x", {})


def test_upkeep_measures_once_and_prices_the_guard_with_it(monkeypatch):
    cal = Calibration.linear(0.1, step_seconds=0.05)
    measured: list[int] = []
    monkeypatch.setattr("edgespec.engine.upkeep.trusted_calibration",
                        lambda *a: measured.append(1) or cal)
    guard = GoodputGuard(ControlSettings())
    described: list[int] = []
    up = Upkeep(FakeModel(), EngineConfig(target="t"), 2, guard,
                describe=lambda: described.append(1) or object(), exact_cap=3)
    assert up.calibration() is cal and up.calibration() is cal and measured == [1]
    assert guard.plain_seconds_prior == 0.05
    assert up.exact_max_draft() == 3  # handed in: not probed
    first = up.identity()
    assert up.identity() is first and described == [1]
    up.forget_identity()
    assert up.identity() is not first and described == [1, 1]


def test_adding_a_proposer_changes_the_engine_identity():
    eng = fake_engine(FakeModel(), {"ngram": free_proposer("ngram")})
    before = eng.identity
    eng.add_proposer("extra", free_proposer("suffix"))
    assert eng.identity is not before
    assert "extra" in eng.identity.components["features"]["proposers"]


def test_a_constructor_that_fails_closes_what_it_was_handed():
    log: list[str] = []
    resources = ExitStack()
    resources.callback(log.append, "model")
    model = FakeModel()
    ctx = model.new_context(n_ctx=64, n_batch=16)
    with pytest.raises(InvalidInputError, match="'draft' is not loaded"):
        Engine(model, ctx, config=EngineConfig(target="t", proposer="ngram"), proposers={},
               resources=resources, default_proposer="draft")
    assert log == ["model"]
