"""The MTP head's cost per draft token, measured beside a NextN target's curve and cached
in the same file (fakes here; tests/integration/test_mtp_real.py times a real head)."""
from __future__ import annotations

import json

import pytest

from edgespec.calibration import cache, cpu, measuring
from edgespec.calibration.curve import Calibration
from edgespec.engine.build import _price_heads


class Model:
    def __init__(self, load_mtp: bool) -> None:
        self.load_mtp, self.closed = load_mtp, False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def nextn(tmp_path, monkeypatch):
    """A NextN target file whose curve is measured by a stub and head timed at 2 ms."""
    path = tmp_path / "nextn.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setattr(cpu, "machine_busy", lambda: 0.0)
    monkeypatch.setattr(cache, "nextn_layers", lambda p: 1)
    monkeypatch.setattr(measuring, "measure", lambda model, **kw: Calibration.prior_cpu(0.05))
    timed = []
    monkeypatch.setattr(measuring, "measure_head",
                        lambda model, **kw: timed.append(model) or 0.002)
    return path, timed


def test_a_nextn_target_is_loaded_with_its_head_and_the_head_timed_once(nextn, tmp_path):
    path, timed = nextn
    loads = []

    def loader(p, n_gpu_layers=0, use_extra_bufts=True, load_mtp=False):
        loads.append(load_mtp)
        return Model(load_mtp)

    args = dict(n_threads=2, home=tmp_path / "home", build="b", loader=loader, repeats=1)
    cal = cache.load_or_measure(path, **args)
    assert loads == [True] and cal.mtp_step_seconds == 0.002 and len(timed) == 1
    stored = json.loads(cache.cache_path(cal.key, tmp_path / "home").read_text())
    assert stored["mtp_step_seconds"] == 0.002
    assert cache.load_or_measure(path, **args).mtp_step_seconds == 0.002 and len(timed) == 1


def test_a_cached_curve_without_the_head_cost_gets_it_from_a_model_with_the_head(nextn, tmp_path):
    path, timed = nextn
    args = dict(n_threads=2, home=tmp_path / "home", build="b", repeats=1)
    first = cache.load_or_measure(path, model=Model(load_mtp=False), **args)
    assert first.mtp_step_seconds is None and not timed  # never a second load of the target
    again = cache.load_or_measure(path, model=Model(load_mtp=True), **args)
    assert again.mtp_step_seconds == 0.002 and again.points == first.points


def test_older_files_read_without_a_head_cost_and_it_round_trips():
    cal = Calibration.prior_cpu(0.05)
    raw = cal.to_json()
    assert raw["mtp_step_seconds"] is None
    raw.pop("mtp_step_seconds")
    assert Calibration.from_json(raw).mtp_step_seconds is None
    with_head = Calibration.from_json({**raw, "mtp_step_seconds": 0.003})
    assert with_head.mtp_step_seconds == 0.003
    assert Calibration.from_json(with_head.to_json()) == with_head


def test_the_engine_prices_mtp_drafts_with_the_measured_head_cost():
    class P:
        seconds_per_token = 0.0

    loaded = {"mtp": P(), "ngram": P()}
    _price_heads(loaded, Calibration.from_costs({1: 1.0}, 0.05, mtp_step_seconds=0.004))
    assert loaded["mtp"].seconds_per_token == 0.004 and loaded["ngram"].seconds_per_token == 0.0
    fresh = {"mtp": P()}
    _price_heads(fresh, None)
    assert fresh["mtp"].seconds_per_token == 0.0
