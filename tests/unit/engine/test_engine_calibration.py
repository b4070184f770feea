"""Which cost curve an adaptive engine prices drafts with when its cached calibration is
not trusted: the device's own (re-measured, or jittery but quiet) before a prior that was
measured on another CPU."""
from types import SimpleNamespace

import pytest

from edgespec.calibration import cache, cpu
from edgespec.calibration.curve import Calibration, CalibrationWarning
from edgespec.engine import build as engmod
from edgespec.runtime.kernel import KernelConfig

STEEP = {1: 1.0, 2: 1.7, 4: 2.9, 8: 6.6, 16: 8.0}
MODEL = SimpleNamespace(path="/models/m.gguf", n_gpu_layers=0, size_bytes=1_111_370_240)


def _cal(spread, busy=0.0, step=0.040):
    samples = {n: tuple(step * c * (1 + spread * d) for d in (-1, -0.5, 0, 0.5, 1))
               for n, c in STEEP.items()}
    return Calibration(step_seconds=step, points=tuple(STEEP.items()), source="measured",
                       samples=samples, busy=busy)


@pytest.fixture
def measured(monkeypatch):
    """load_or_measure returns the queued calibrations in turn; records force= per call."""
    calls, queue = [], []

    def fake(path, *, force=False, **kw):
        calls.append(force)
        return queue.pop(0)
    monkeypatch.setattr(cache, "load_or_measure", fake)
    # a queued curve stands for one in the cache (the busy check before a first measurement)
    monkeypatch.setattr(cache, "cached", lambda *a, **kw: queue[0] if queue else None)
    return calls, queue


def test_a_jittery_cached_curve_is_used_as_it_is(measured, monkeypatch):
    calls, queue = measured
    queue.append(_cal(0.22))
    monkeypatch.setattr(cpu, "machine_busy", lambda *a: 0.0)
    cal = engmod.trusted_calibration(MODEL, 2, KernelConfig())
    assert cal.source == "measured" and cal.cost(16) == pytest.approx(8.0)
    assert calls == [False]  # not measured again at every load


def test_a_noise_curve_is_measured_again_when_the_machine_is_quiet(measured, monkeypatch):
    calls, queue = measured
    queue += [_cal(0.8), _cal(0.02)]
    monkeypatch.setattr(cpu, "machine_busy", lambda *a: 0.0)
    with pytest.warns(CalibrationWarning, match="measuring it again"):
        cal = engmod.trusted_calibration(MODEL, 2, KernelConfig())
    assert calls == [False, True]
    assert cal.source == "measured" and cal.cost(8) == pytest.approx(6.6)


def test_a_noise_curve_on_a_busy_machine_falls_back_to_the_prior_and_says_so(measured, monkeypatch):
    calls, queue = measured
    queue.append(_cal(0.8))
    monkeypatch.setattr(cpu, "machine_busy", lambda *a: 0.9)
    with pytest.warns(CalibrationWarning, match="CPU prior"):
        cal = engmod.trusted_calibration(MODEL, 2, KernelConfig())
    assert calls == [False] and cal.source == "prior"


def test_nothing_cached_on_a_busy_machine_is_not_measured_but_priced_with_the_prior(
        measured, monkeypatch):
    """A first run under load would spend minutes timing passes that are then rejected as
    noise: it prices drafts with the prior at once and says why in one warning."""
    calls, queue = measured  # nothing queued: nothing cached
    monkeypatch.setattr(cpu, "machine_busy", lambda *a: 0.9)
    with pytest.warns(CalibrationWarning, match="not measured now") as got:
        cal = engmod.trusted_calibration(MODEL, 2, KernelConfig())
    assert calls == [] and cal.source == "prior"
    assert len(got) == 1 and "90%" in str(got[0].message)


def test_nothing_cached_on_a_quiet_machine_is_measured(measured, monkeypatch):
    calls, queue = measured
    monkeypatch.setattr(cpu, "machine_busy", lambda *a: 0.0)
    monkeypatch.setattr(cache, "cached", lambda *a, **kw: None)
    queue.append(_cal(0.02))
    cal = engmod.trusted_calibration(MODEL, 2, KernelConfig())
    assert calls == [False] and cal.source == "measured"
