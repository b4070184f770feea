"""Calibration on a real model (SmolLM2-135M: a measurement takes about a second)."""
from __future__ import annotations

from edgespec.calibration import cache as calibration, cpu


def test_measures_and_caches_a_real_cost_curve(model_path, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "machine_busy", lambda: 0.0)  # the cache must answer
    # ... and the curve counts as measured quiet even when other processes run (a curve
    # measured under load is re-measured once the machine is quiet, by design)
    monkeypatch.setattr(cpu.CpuWatch, "share", lambda self: 0.0)
    path = model_path("smollm2-135m")
    cal = calibration.load_or_measure(path, n_threads=1, home=tmp_path, ks=(1, 2, 4, 8), repeats=3)
    assert cal.source == "measured" and cal.step_seconds > 0
    assert [n for n, _ in cal.points] == [1, 2, 4, 8]
    # a longer batch is never cheaper, and 8 tokens never cost 8 single passes on any device
    assert 1.0 <= cal.cost(2) <= cal.cost(4) <= cal.cost(8) < 8.0
    assert cal.device["threads"] == "1" and int(cal.model["size"]) == path.stat().st_size
    again = calibration.load_or_measure(path, n_threads=1, home=tmp_path, ks=(1, 2, 4, 8), repeats=3)
    assert again == cal  # served from the cache
