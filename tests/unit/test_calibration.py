"""Calibration: the cost curve, its interpolation, the cache, and measuring a fake backend."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec import calibration as calmod
from edgespec.calibration import DEFAULT_KS, Calibration
from edgespec.errors import EdgespecError


# --- a fake backend whose passes cost what a cost model says ---------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeContext:
    def __init__(self, model: "FakeModel", n_ctx: int, n_batch: int) -> None:
        self.model, self.n_ctx, self.n_batch = model, n_ctx, n_batch
        self.kv = 0
        self.closed = False
        self.calls: list[tuple[int, int, str]] = []

    def decode(self, tokens, pos0, seq_id=0, logits="last"):
        assert pos0 == self.kv, "decoded at a position the cache does not end at"
        assert len(tokens) <= self.n_batch or logits != "all"
        assert all(0 <= t < self.model.n_vocab for t in tokens)
        self.calls.append((len(tokens), pos0, logits))
        self.model.clock.t += self.model.seconds(len(tokens))
        self.kv = pos0 + len(tokens)
        rows = len(tokens) if logits == "all" else 1
        return np.zeros((rows, self.model.n_vocab), dtype=np.float32)

    def trim(self, seq_id, from_pos):
        assert from_pos <= self.kv
        self.kv = from_pos

    def close(self):
        self.closed = True


class FakeModel:
    n_vocab = 5000

    def __init__(self, seconds, clock: FakeClock) -> None:
        self.seconds = seconds  # n tokens -> seconds
        self.clock = clock
        self.contexts: list[FakeContext] = []
        self.closed = False

    def new_context(self, n_ctx, n_batch=512, n_threads=None):
        ctx = FakeContext(self, n_ctx, n_batch)
        self.contexts.append(ctx)
        return ctx

    def close(self):
        self.closed = True


def cpu_like(n: int) -> float:
    return 0.080 * Calibration.prior_cpu().cost(n)


# --- the curve ---------------------------------------------------------------------
def test_cost_is_one_at_one_token_and_interpolates_linearly():
    cal = Calibration.from_costs({1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0}, step_seconds=0.1)
    assert cal.cost(1) == 1.0
    assert cal.cost(2) == 1.5
    assert cal.cost(3) == pytest.approx(1.75)
    assert cal.cost(6) == pytest.approx(2.5)
    # past the last point: the last segment's slope (0.25 per token)
    assert cal.cost(12) == pytest.approx(4.0)
    assert cal.seconds(4) == pytest.approx(0.2)
    assert cal.verify_cost(3) == cal.cost(4)  # 3 drafts + the last token = a 4-token pass


def test_noisy_points_are_made_monotone_and_one_is_pinned():
    cal = Calibration.from_costs({1: 1.07, 2: 1.6, 3: 1.4, 4: 2.0}, step_seconds=0.1)
    assert cal.points == ((1, 1.0), (2, 1.6), (3, 1.6), (4, 2.0))
    assert all(cal.cost(n + 1) >= cal.cost(n) for n in range(1, 20))


def test_missing_one_token_point_is_added():
    cal = Calibration.from_costs({4: 2.0}, step_seconds=0.1)
    assert cal.points[0] == (1, 1.0)
    assert cal.cost(2.5) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        cal.cost(0)
    with pytest.raises(ValueError):
        Calibration.from_costs({1: 1.0}, step_seconds=0.0)


def test_prior_matches_the_documented_cpu_numbers():
    cal = Calibration.prior_cpu()
    assert cal.cost(2) == 1.5 and cal.cost(8) == 2.86 and cal.cost(16) == 3.44
    assert cal.cost(4) == pytest.approx((1.78 + 2.06) / 2)
    assert cal.step_seconds == pytest.approx(0.086)
    flat = Calibration.linear(0.0)
    assert flat.cost(16) == 1.0


def test_json_round_trip_keeps_everything():
    cal = Calibration(step_seconds=0.09, points=((1, 1.0), (2, 1.4), (8, 2.5)), key="k-1",
                      device={"cpu": "x"}, model={"sha256": "ab", "size": "3"},
                      samples={1: (0.09, 0.091), 2: (0.126,)}, measured_at=12.5)
    back = Calibration.from_json(json.loads(json.dumps(cal.to_json())))
    assert back == cal
    with pytest.raises(ValueError):
        Calibration.from_json({**cal.to_json(), "format": 99})


# --- measuring ---------------------------------------------------------------------
def test_measure_recovers_the_fake_cost_curve():
    clock = FakeClock()
    model = FakeModel(cpu_like, clock)
    cal = calmod.measure(model, n_threads=2, repeats=3, clock=clock)
    assert cal.step_seconds == pytest.approx(0.080)
    for n in DEFAULT_KS:
        assert cal.cost(n) == pytest.approx(Calibration.prior_cpu().cost(n))
    assert all(len(v) == 3 for v in cal.samples.values())  # the warm-up round is dropped
    ctx = model.contexts[0]
    assert ctx.closed
    # timed passes ask for all-position logits, as verification does
    assert {c[2] for c in ctx.calls[1:]} == {"all"}
    # every timed pass starts at the same position: the cache was trimmed back each time
    assert len({c[1] for c in ctx.calls[1:]}) == 1


def test_measure_takes_the_median_so_one_slow_pass_does_not_matter():
    clock = FakeClock()
    calls = {"n": 0}

    def spiky(n: int) -> float:
        calls["n"] += 1
        return cpu_like(n) * (20.0 if calls["n"] == 12 else 1.0)  # someone else's burst

    cal = calmod.measure(FakeModel(spiky, clock), repeats=5, clock=clock)
    for n in DEFAULT_KS:
        assert cal.cost(n) == pytest.approx(Calibration.prior_cpu().cost(n))


def test_measure_rejects_a_stopped_clock():
    with pytest.raises(EdgespecError, match="clock"):
        calmod.measure(FakeModel(lambda n: 0.0, FakeClock()), repeats=1, clock=FakeClock())


# --- cache -------------------------------------------------------------------------
@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "tiny.gguf"
    p.write_bytes(b"GGUF" + bytes(range(200)))
    return p


def test_load_or_measure_caches_per_device_and_model(tmp_path, model_file, monkeypatch):
    home = tmp_path / "home"
    loads = []

    def loader(path, n_gpu_layers=0):
        loads.append(path)
        return FakeModel(cpu_like, FakeClock())

    real_measure = calmod.measure
    monkeypatch.setattr(calmod, "measure", lambda model, **kw: real_measure(model, clock=model.clock, **kw))

    def get(**kw):
        args = dict(n_threads=2, home=home, build="test-build", loader=loader, repeats=2)
        return calmod.load_or_measure(model_file, **{**args, **kw})

    first = get()
    assert len(loads) == 1
    assert first.key and first.model["size"] == str(model_file.stat().st_size)
    assert first.device["threads"] == "2" and first.device["build"] == "test-build"
    assert first.cost(2) == pytest.approx(1.5)
    assert calmod.cache_path(first.key, home).is_file()
    assert get() == first and len(loads) == 1  # from the cache, not measured
    other = get(n_threads=1)
    assert len(loads) == 2 and other.key != first.key  # other threads, other curve
    assert get(build="other-build").key != first.key and len(loads) == 3
    forced = get(force=True)
    assert len(loads) == 4 and forced.key == first.key


def test_an_already_loaded_model_is_measured_not_reloaded(tmp_path, model_file):
    clock = FakeClock()
    model = FakeModel(cpu_like, clock)

    def loader(*a, **k):
        raise AssertionError("loaded the model again")

    cal = calmod.load_or_measure(model_file, n_threads=2, home=tmp_path, build="b", model=model,
                                 loader=loader, repeats=1)
    # measured with the wall clock against a fake that costs no wall time: only the shape
    # of the call matters here, and that the caller's model stays open
    assert not model.closed and cal.key


def test_a_changed_model_file_gets_a_new_key(tmp_path, model_file):
    home = tmp_path / "home"
    dev = calmod.device_fingerprint(2, build="b")
    k1 = calmod.cache_key(dev, calmod.model_identity(model_file, home=home))
    model_file.write_bytes(b"GGUF" + bytes(range(201)))
    k2 = calmod.cache_key(dev, calmod.model_identity(model_file, home=home))
    assert k1 != k2
    # a registry digest skips hashing and is what the key uses
    k3 = calmod.cache_key(dev, calmod.model_identity(model_file, sha256="f" * 64, home=home))
    assert k3 not in (k1, k2)


def test_digest_is_computed_once(tmp_path, model_file, monkeypatch):
    home = tmp_path / "home"
    first = calmod.model_identity(model_file, home=home)
    import hashlib
    assert first["sha256"] == hashlib.sha256(model_file.read_bytes()).hexdigest()

    def boom(*a, **k):
        raise AssertionError("re-hashed an unchanged file")

    monkeypatch.setattr(calmod.hashlib, "sha256", boom)
    assert calmod.model_identity(model_file, home=home)["sha256"] == first["sha256"]


def test_corrupt_cache_file_means_measure_again(tmp_path):
    home = tmp_path
    path = calmod.cache_path("abc", home)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert calmod.load_cached("abc", home) is None
    path.write_text(json.dumps({"format": 1, "points": "bad"}))
    assert calmod.load_cached("abc", home) is None


def test_missing_model_file_is_a_user_error(tmp_path):
    with pytest.raises(EdgespecError, match="cannot read model file"):
        calmod.model_identity(tmp_path / "nope.gguf")


def test_summary_line():
    line = calmod.summarize(Calibration.prior_cpu(), ns=(1, 2))
    assert "86.0 ms" in line and "2:1.50" in line


def test_a_busy_measurement_is_redone_once_the_machine_is_quiet(tmp_path, model_file, monkeypatch):
    loads = []

    def loader(path, n_gpu_layers=0):
        loads.append(path)
        return FakeModel(cpu_like, FakeClock())

    real_measure = calmod.measure
    monkeypatch.setattr(calmod, "measure", lambda model, **kw: real_measure(model, clock=model.clock, **kw))
    load = {"v": 3.0}
    monkeypatch.setattr(calmod, "machine_busy", lambda: load["v"])

    def get():
        return calmod.load_or_measure(model_file, n_threads=2, home=tmp_path, build="b",
                                      loader=loader, repeats=1)

    busy = get()
    assert busy.busy == 3.0 and "under load" in calmod.summarize(busy)
    get()
    assert len(loads) == 1  # still busy: the cached curve is the best there is
    load["v"] = 0.2
    quiet = get()
    assert len(loads) == 2 and quiet.busy == 0.2
    get()
    assert len(loads) == 2  # a quiet measurement is kept
