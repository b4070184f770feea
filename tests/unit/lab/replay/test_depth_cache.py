"""lab.replay.depth_cache: --record's depth curves are measured once per machine, model,
kernel configuration, build and set of depths, and measured again when the cache cannot
be trusted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.calibration import cpu
from edgespec.calibration.curve import Calibration, CalibrationWarning
from edgespec.lab.replay import depth_cache
from edgespec.lab.replay.cost import DepthCurve
from edgespec.runtime.kernel import KernelConfig


class Model:
    def __init__(self, path: Path):
        self.path = path


class Measure:
    """Stands in for measure_depths: counts calls, and each curve's step says which call."""

    def __init__(self, busy: float = 0.0):
        self.calls: list[tuple[tuple[int, ...], KernelConfig]] = []
        self.busy = busy

    def __call__(self, model, depths, *, n_threads, kernel, ks):
        self.calls.append((tuple(depths), kernel))
        step = 0.01 * len(self.calls)
        return DepthCurve(tuple((d, Calibration(step_seconds=step * (1 + d / 1000),
                                                points=((1, 1.0), (4, 2.0))))
                                for d in depths), busy=self.busy)


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setattr(cpu, "machine_busy", lambda seconds=0.3: 0.0)


@pytest.fixture
def model(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)
    return Model(f)


def _kw(tmp_path, measure, **over):
    return {**dict(n_threads=2, kernel=KernelConfig(kv_type="f16"), home=tmp_path / "home",
                   build="b1", measure=measure), **over}


def test_a_second_run_reads_the_curve_the_first_one_measured(model, tmp_path):
    m = Measure()
    first, when = depth_cache.load_or_measure(model, (64, 256), **_kw(tmp_path, m))
    assert when is None and len(m.calls) == 1
    again, when = depth_cache.load_or_measure(model, (64, 256), **_kw(tmp_path, m))
    assert len(m.calls) == 1 and when is not None and when > 0
    assert again.depths == (64, 256)
    assert again.seconds(4, 256) == pytest.approx(first.seconds(4, 256))
    assert len(list((tmp_path / "home" / "calibration").glob("depths-m-*.json"))) == 1


def test_other_depths_threads_kernels_or_builds_measure_their_own(model, tmp_path):
    m = Measure()
    depth_cache.load_or_measure(model, (64, 256), **_kw(tmp_path, m))
    depth_cache.load_or_measure(model, (64, 256, 1024), **_kw(tmp_path, m))
    depth_cache.load_or_measure(model, (64, 256), **_kw(tmp_path, m, kernel=KernelConfig()))
    depth_cache.load_or_measure(model, (64, 256), **_kw(tmp_path, m, n_threads=1))
    assert len(m.calls) == 4
    with pytest.warns(CalibrationWarning, match="another llama.cpp build"):
        depth_cache.load_or_measure(model, (64, 256), **_kw(tmp_path, m, build="b2"))
    assert len(m.calls) == 5
    # the same request again: all cached now, nothing measured
    depth_cache.load_or_measure(model, (64, 256, 1024), **_kw(tmp_path, m))
    assert len(m.calls) == 5


def test_a_corrupt_or_foreign_file_is_said_and_measured_again(model, tmp_path):
    m = Measure()
    depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, m))
    [path] = (tmp_path / "home" / "calibration").glob("depths-*.json")
    path.write_text("{not json", encoding="utf-8")
    with pytest.warns(CalibrationWarning, match="unreadable"):
        depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, m))
    d = json.loads(path.read_text())
    d["format"] = 99
    path.write_text(json.dumps(d))
    with pytest.warns(CalibrationWarning, match="format 99"):
        depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, m))
    assert len(m.calls) == 3


def test_a_curve_timed_under_load_is_measured_again_once_the_machine_is_quiet(model, tmp_path,
                                                                              monkeypatch):
    busy = Measure(busy=0.9)
    depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, busy))
    monkeypatch.setattr(cpu, "machine_busy", lambda seconds=0.3: 0.9)
    _, when = depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, busy))
    assert len(busy.calls) == 1 and when is not None  # still busy: better than nothing
    monkeypatch.setattr(cpu, "machine_busy", lambda seconds=0.3: 0.0)
    with pytest.warns(CalibrationWarning, match="quiet now"):
        _, when = depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, busy))
    assert len(busy.calls) == 2 and when is None


def test_force_measures_and_a_read_only_home_still_gets_a_curve(model, tmp_path):
    m = Measure()
    depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, m))
    depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, m, force=True))
    assert len(m.calls) == 2
    home = tmp_path / "ro"
    home.mkdir()
    (home / "calibration").write_text("a file where the folder should be")
    with pytest.warns(CalibrationWarning, match="unreadable"):
        curve, when = depth_cache.load_or_measure(model, (64,), **_kw(tmp_path, m, home=home))
    assert when is None and curve.depths == (64,)
