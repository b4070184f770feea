"""Calibration: the cost curve, its interpolation, the exactness probe, the cache, and
measuring a fake backend."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.calibration import cache, cpu, curve, measuring, progress
from edgespec.registry import digests
from edgespec.calibration.curve import DEFAULT_KS, Calibration, CalibrationWarning
from edgespec.runtime.kernel import KernelConfig
from edgespec.errors import EdgespecError


# --- a fake backend whose passes cost what a cost model says ---------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeContext:
    """A KV cache of (position, token, written-exactly) cells and logits that are a pure
    function of them, except where the model's kernels are made batch dependent."""

    def __init__(self, model: "FakeModel", n_ctx: int, n_batch: int, switches: dict) -> None:
        self.model, self.n_ctx, self.n_batch = model, n_ctx, n_batch
        self.switches = switches
        self.kv: list[bool] = []  # per cached position: written by an odd (batch-dependent) kernel
        self.closed = False
        self.calls: list[tuple[int, int, str]] = []

    def decode(self, tokens, pos0, seq_id=0, logits="last"):
        assert pos0 == len(self.kv), "decoded at a position the cache does not end at"
        assert len(tokens) <= self.n_ctx - pos0
        assert len(tokens) <= self.n_batch or logits != "all"
        assert all(0 <= t < self.model.n_vocab for t in tokens)
        self.calls.append((len(tokens), pos0, logits))
        m = self.model
        m.clock.t += m.seconds(len(tokens))
        n = len(tokens)
        # a batch from `inexact_from` tokens on takes another kernel; a single token past
        # `long_single_from` cached cells takes another attention path (F16 split-KV)
        odd = (m.inexact_from is not None and n >= m.inexact_from) or \
            (n == 1 and m.long_single_from is not None and pos0 >= m.long_single_from)
        # what the cells cached before this pass hold: the same prefix gives the same sum
        written = sum(self.kv)
        self.kv += [odd] * n
        if logits == "none":
            return np.zeros((0, 8), dtype=np.float32)
        shift = np.float32(1e-3 * odd + 1e-4 * written)  # last-bits differences, scaled up
        out = np.stack([m.row(pos0 + i, t) + shift for i, t in enumerate(tokens)])
        return out if logits == "all" else out[-1:]

    def trim(self, seq_id, from_pos):
        assert from_pos <= len(self.kv)
        del self.kv[from_pos:]

    def clear(self):
        self.kv = []

    def close(self):
        self.closed = True


class FakeModel:
    n_vocab = 5000

    def __init__(self, seconds, clock: FakeClock, inexact_from: int | None = None,
                 long_single_from: int | None = None, repacked: bool = True) -> None:
        self.seconds = seconds  # n tokens -> seconds
        self.clock = clock
        self.inexact_from = inexact_from
        self.long_single_from = long_single_from
        self.use_extra_bufts = repacked
        self.contexts: list[FakeContext] = []
        self.closed = False

    def row(self, pos: int, tok: int) -> np.ndarray:
        return np.random.default_rng(pos * 100_003 + tok).standard_normal(8).astype(np.float32)

    def new_context(self, n_ctx, n_batch=512, n_threads=None, **switches):
        ctx = FakeContext(self, n_ctx, n_batch, switches)
        self.contexts.append(ctx)
        return ctx

    def close(self):
        self.closed = True


def cpu_like(n: int) -> float:
    return 0.080 * Calibration.prior_cpu().cost(n)


# --- the curve ---------------------------------------------------------------------

@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """measure() records other processes' CPU share; the tests decide it, not the machine."""
    class Watch:
        def share(self):
            return 0.0

    monkeypatch.setattr(cpu, "CpuWatch", Watch)

def test_cost_is_one_at_one_token_and_interpolates_linearly():
    cal = Calibration.from_costs({1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0}, step_seconds=0.1)
    assert cal.cost(1) == 1.0
    assert cal.cost(2) == 1.5
    assert cal.cost(3) == pytest.approx(1.75)
    assert cal.cost(6) == pytest.approx(2.5)
    # past the last point: the steeper of the last segment's slope (0.25 per token) and
    # the average cost per token so far (3/8)
    assert cal.cost(12) == pytest.approx(4.5)
    # a last segment that dips does not make further positions free
    dip = Calibration.from_costs({1: 1.0, 12: 7.4, 16: 7.0}, step_seconds=0.1)
    assert dip.cost(32) == pytest.approx(7.0 + 7.0 / 16 * 16)
    assert cal.seconds(4) == pytest.approx(0.2)
    assert cal.verify_cost(3) == cal.cost(4)  # 3 drafts + the last token = a 4-token pass


def test_the_curve_is_kept_as_measured_with_one_pinned():
    # repacked weights on a 2-core CPU: a 3-token pass takes gemv, a 4-token one the
    # 4-column gemm, which is cheaper (docs/parity.md)
    cal = Calibration.from_costs({1: 1.07, 2: 1.5, 3: 2.0, 4: 1.7, 8: 3.0, 16: 3.4},
                                 step_seconds=0.1)
    assert cal.points == ((1, 1.0), (2, 1.5), (3, 2.0), (4, 1.7), (8, 3.0), (16, 3.4))
    assert cal.cost(4) < cal.cost(3)
    assert cal.verify_cost(3) == pytest.approx(1.7)
    assert cal.cost(3.5) == pytest.approx(1.85)  # linear between the measured points
    assert cal.cost(6) == pytest.approx(2.35)
    # noise below a 1-token pass is clipped there; a falling last segment never extrapolates
    # to cheaper passes, nor to free ones: past the range, the average cost per token
    odd = Calibration.from_costs({2: 0.97, 8: 3.0, 12: 2.9}, step_seconds=0.1)
    assert odd.cost(2) == 1.0 and odd.cost(20) == pytest.approx(2.9 + 2.9 / 12 * 8)


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
    cal = measuring.measure(model, n_threads=2, repeats=3, clock=clock)
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


class _Begins:
    """A progress reporter that keeps what each measurement said when it began."""

    def __init__(self) -> None:
        self.begun: list[tuple[str, bool]] = []

    def begin(self, what: str, total: int, cached: bool = True) -> None:
        self.begun.append((what, cached))

    def update(self, what, done, total, elapsed) -> None:
        pass

    def end(self, what, elapsed) -> None:
        pass


def test_a_depth_curve_names_its_depth_and_says_whether_it_is_kept():
    """--record's curves: their progress names the depth and the count, and says they are
    kept only when the caller keeps them (lab.replay.depth_cache does; that note once had a
    bench log wait half an hour for a cache that was never written)."""
    from edgespec.lab.replay.depth import measure_depths

    seen = _Begins()
    old = progress.set_reporter(seen)
    try:
        clock = FakeClock()
        measure_depths(FakeModel(cpu_like, clock), (64, 256), repeats=1, clock=clock,
                       cached=False)
        measuring.measure(FakeModel(cpu_like, clock), repeats=1, probe=False, clock=clock)
        measure_depths(FakeModel(cpu_like, clock), (64,), repeats=1, clock=clock)
    finally:
        progress.set_reporter(old)
    assert [c for _, c in seen.begun] == [False, False, True, True]
    assert "after 64 cached tokens (1 of 2 depths" in seen.begun[0][0]
    assert "after 256 cached tokens (2 of 2 depths" in seen.begun[1][0]
    assert seen.begun[2][0] == "timing verify passes of 1-16 tokens"


def test_measure_takes_the_median_so_one_slow_pass_does_not_matter():
    clock = FakeClock()
    calls = {"n": 0}

    def spiky(n: int) -> float:
        calls["n"] += 1
        return cpu_like(n) * (20.0 if calls["n"] == 12 else 1.0)  # someone else's burst

    cal = measuring.measure(FakeModel(spiky, clock), repeats=5, clock=clock)
    for n in DEFAULT_KS:
        assert cal.cost(n) == pytest.approx(Calibration.prior_cpu().cost(n))


def test_measure_rejects_a_stopped_clock():
    with pytest.raises(EdgespecError, match="clock"):
        measuring.measure(FakeModel(lambda n: 0.0, FakeClock()), repeats=1, clock=FakeClock())


# --- cache -------------------------------------------------------------------------
@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "tiny.gguf"
    p.write_bytes(b"GGUF" + bytes(range(200)))
    return p


def test_load_or_measure_caches_per_device_and_model(tmp_path, model_file, monkeypatch):
    home = tmp_path / "home"
    loads = []
    monkeypatch.setattr(cpu, "machine_busy", lambda: 0.0)

    def loader(path, n_gpu_layers=0, use_extra_bufts=True):
        loads.append(path)
        return FakeModel(cpu_like, FakeClock(), repacked=use_extra_bufts)

    real_measure = measuring.measure
    monkeypatch.setattr(measuring, "measure", lambda model, **kw: real_measure(model, clock=model.clock, **kw))

    def get(**kw):
        args = dict(n_threads=2, home=home, build="test-build", loader=loader, repeats=2)
        return cache.load_or_measure(model_file, **{**args, **kw})

    first = get()
    assert len(loads) == 1
    assert first.key and first.model["size"] == str(model_file.stat().st_size)
    assert first.device["threads"] == "2" and first.device["build"] == "test-build"
    assert first.cost(2) == pytest.approx(1.5)
    assert cache.cache_path(first.key, home).is_file()
    assert get() == first and len(loads) == 1  # from the cache, not measured
    other = get(n_threads=1)
    assert len(loads) == 2 and other.key != first.key  # other threads, other curve
    # another llama.cpp build: the file is found, reported stale and measured again
    with pytest.warns(CalibrationWarning, match="another llama.cpp build.*measuring it again"):
        rebuilt = get(build="other-build")
    assert len(loads) == 3 and rebuilt.device["build"] == "other-build"
    assert get(build="other-build") == rebuilt and len(loads) == 3
    # another kernel configuration: another curve and another exactness limit
    plain_kv = get(build="other-build", kernel=KernelConfig(repack=False, kv_type="f16"))
    assert len(loads) == 4 and plain_kv.key != rebuilt.key
    assert plain_kv.device["kernel"] == "repack=0,fa=1,kv=f16"
    forced = get(force=True, build="other-build")
    assert len(loads) == 5 and forced.key == first.key


def test_an_already_loaded_model_is_measured_not_reloaded(tmp_path, model_file):
    clock = FakeClock()
    model = FakeModel(cpu_like, clock)

    def loader(*a, **k):
        raise AssertionError("loaded the model again")

    cal = cache.load_or_measure(model_file, n_threads=2, home=tmp_path, build="b", model=model,
                                 loader=loader, repeats=1)
    # measured with the wall clock against a fake that costs no wall time: only the shape
    # of the call matters here, and that the caller's model stays open
    assert not model.closed and cal.key


def test_a_changed_model_file_gets_a_new_key(tmp_path, model_file):
    home = tmp_path / "home"
    dev = cache.device_fingerprint(2, build="b")
    k1 = cache.cache_key(dev, digests.model_identity(model_file, home=home))
    model_file.write_bytes(b"GGUF" + bytes(range(201)))
    k2 = cache.cache_key(dev, digests.model_identity(model_file, home=home))
    assert k1 != k2
    # a registry digest skips hashing and is what the key uses
    k3 = cache.cache_key(dev, digests.model_identity(model_file, sha256="f" * 64, home=home))
    assert k3 not in (k1, k2)


def test_digest_is_computed_once(tmp_path, model_file, monkeypatch):
    home = tmp_path / "home"
    first = digests.model_identity(model_file, home=home)
    import hashlib
    assert first["sha256"] == hashlib.sha256(model_file.read_bytes()).hexdigest()

    def boom(*a, **k):
        raise AssertionError("re-hashed an unchanged file")

    monkeypatch.setattr(digests.hashlib, "sha256", boom)
    assert digests.model_identity(model_file, home=home)["sha256"] == first["sha256"]


def test_corrupt_cache_file_means_measure_again(tmp_path):
    home = tmp_path
    path = cache.cache_path("abc", home)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.warns(CalibrationWarning, match="is corrupt.*measuring it again"):
        assert cache.load_cached("abc", home) is None
    path.write_text(json.dumps({"format": 2, "points": "bad"}))
    with pytest.warns(CalibrationWarning, match="is corrupt"):
        assert cache.load_cached("abc", home) is None
    path.write_text(json.dumps({"format": 1, "step_seconds": 0.1, "points": [[1, 1.0]]}))
    with pytest.warns(CalibrationWarning, match="format 1 by another edgespec version"):
        assert cache.load_cached("abc", home) is None
    assert cache.load_cached("missing", home) is None  # nothing cached: no warning


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"format": 2, "step_seconds": -1}',
                                     '{"format": 1, "step_seconds": 0.1, "points": [[1, 1.0]]}'])
def test_a_stale_or_corrupt_cache_file_is_measured_again_and_replaced(tmp_path, model_file,
                                                                      monkeypatch, content):
    monkeypatch.setattr(cpu, "machine_busy", lambda: 0.0)
    loads = []

    def loader(path, n_gpu_layers=0, use_extra_bufts=True):
        loads.append(path)
        return FakeModel(cpu_like, FakeClock(), inexact_from=4)

    def get():
        return cache.load_or_measure(model_file, n_threads=2, home=tmp_path, build="b",
                                      loader=loader, repeats=1)

    first = get()
    path = cache.cache_path(first.key, tmp_path)
    path.write_text(content)
    with pytest.warns(CalibrationWarning, match="measuring it again"):
        again = get()
    assert len(loads) == 2 and again.exact_max_tokens == 3
    assert cache.load_cached(first.key, tmp_path, "b") == again  # the file was rewritten


# --- the exactness probe -------------------------------------------------------------
def probe(model, **kw):
    return measuring.probe_exactness(model, n_threads=2, kernel=KernelConfig(), **kw)


def test_probe_finds_every_size_exact_when_no_kernel_depends_on_the_batch():
    model = FakeModel(cpu_like, FakeClock())
    assert probe(model) == 16
    ctx = model.contexts[0]
    assert ctx.closed
    # the context runs the kernel configuration's attention and KV type
    assert ctx.switches == {"flash_attn": 1, "type_k": 8, "type_v": 8}
    # both context lengths were probed: ~32 and ~600 cached tokens
    assert {c[1] for c in ctx.calls if c[0] > 16} == {0}
    assert {c[0] for c in ctx.calls if c[1] == 0} == {32, 600}


def test_probe_stops_at_the_first_size_a_batch_kernel_changes():
    # repacked weights: gemv below 4 columns, gemm from 4 (the 4-token pass differs)
    model = FakeModel(cpu_like, FakeClock(), inexact_from=4)
    assert probe(model) == 3
    # cheap: the search stopped at 4 tokens and decoded few single tokens to compare with
    ctx = model.contexts[0]
    assert max(c[0] for c in ctx.calls if c[2] == "all") == 4
    assert sum(1 for c in ctx.calls if c[0] == 1) <= 2 * 7  # 5 to compare with, 2 follow-ups
    assert probe(FakeModel(cpu_like, FakeClock(), inexact_from=8)) == 7
    assert probe(FakeModel(cpu_like, FakeClock(), inexact_from=2)) == 1


def test_probe_at_long_context_catches_a_single_token_attention_path():
    # an F16 KV cache: past ~512 cached cells single-token decodes take split-KV attention,
    # which no batch takes; at short context every size looks exact
    model = FakeModel(cpu_like, FakeClock(), long_single_from=512)
    assert probe(model, contexts=(32,)) == 16
    assert probe(model) == 1


def test_probe_checks_the_kv_a_pass_writes_not_only_its_logits():
    class KvOnly(FakeModel):
        # the pass's own rows match, but the cells it wrote differ: the next plain step shows it
        def new_context(self, n_ctx, n_batch=512, n_threads=None, **switches):
            ctx = super().new_context(n_ctx, n_batch, n_threads, **switches)
            real = ctx.decode

            def decode(tokens, pos0, seq_id=0, logits="last"):
                out = real(tokens, pos0, seq_id, logits)
                if len(tokens) >= 6:
                    out = out - np.float32(1e-3)  # undo the row difference, keep the dirty KV
                return out
            ctx.decode = decode
            return ctx

    assert probe(KvOnly(cpu_like, FakeClock(), inexact_from=6)) == 5


def test_probe_refuses_a_model_loaded_with_another_kernel_configuration():
    model = FakeModel(cpu_like, FakeClock(), repacked=False)
    with pytest.raises(EdgespecError, match="repack"):
        probe(model)
    assert measuring.probe_exactness(model, kernel=KernelConfig(repack=False)) == 16


def test_exact_cap_is_measured_once_then_read_from_the_cache(tmp_path, model_file, monkeypatch):
    monkeypatch.setattr(cpu, "machine_busy", lambda: 0.0)
    monkeypatch.setattr(cache, "llama_build", lambda: "b")
    model = FakeModel(cpu_like, FakeClock(), inexact_from=4)
    model.path = model_file
    model.n_gpu_layers = 0
    kernel = KernelConfig()
    assert cache.exact_cap(model, kernel, 2, home=tmp_path) == 2  # 3-token passes: 2 drafts
    made = len(model.contexts)
    assert made == 2  # the curve's context and the probe's
    assert cache.exact_cap(model, kernel, 2, home=tmp_path) == 2
    assert len(model.contexts) == made  # cheap when cached: no decode at all
    cal = cache.cached(model_file, n_threads=2, kernel=kernel, home=tmp_path)
    assert cal is not None and cal.exact_max_tokens == 3 and cal.exact_max_drafts == 2
    # threads are part of the key: 1 thread is probed anew
    assert cache.exact_cap(model, kernel, 1, home=tmp_path) == 2
    assert len(model.contexts) == made + 2
    # a configuration where nothing beyond one token is exact: exact mode cannot draft
    single = FakeModel(cpu_like, FakeClock(), long_single_from=512)
    single.path, single.n_gpu_layers = model_file, 0
    assert cache.exact_cap(single, KernelConfig(kv_type="f16"), 2, home=tmp_path) == 0


def test_missing_model_file_is_a_user_error(tmp_path):
    with pytest.raises(EdgespecError, match="cannot read model file"):
        digests.model_identity(tmp_path / "nope.gguf")


def test_summary_line():
    line = curve.summarize(Calibration.prior_cpu(), ns=(1, 2))
    assert "86.0 ms" in line and "2:1.50" in line


def test_a_busy_measurement_is_redone_once_the_machine_is_quiet(tmp_path, model_file, monkeypatch):
    loads = []

    def loader(path, n_gpu_layers=0, use_extra_bufts=True):
        loads.append(path)
        return FakeModel(cpu_like, FakeClock(), repacked=use_extra_bufts)

    real_measure = measuring.measure
    monkeypatch.setattr(measuring, "measure", lambda model, **kw: real_measure(model, clock=model.clock, **kw))
    load = {"v": 0.9}
    monkeypatch.setattr(cpu, "machine_busy", lambda: load["v"])

    class Watch:  # other processes' CPU share while measure() times its passes
        def share(self):
            return load["v"]

    monkeypatch.setattr(cpu, "CpuWatch", Watch)

    def get():
        return cache.load_or_measure(model_file, n_threads=2, home=tmp_path, build="b",
                                      loader=loader, repeats=1)

    busy = get()
    assert busy.busy == 0.9 and "under load" in curve.summarize(busy)
    get()
    assert len(loads) == 1  # still busy: the cached curve is the best there is
    load["v"] = 0.05
    with pytest.warns(curve.CalibrationWarning, match="90% of the CPUs.*measuring it again"):
        quiet = get()
    assert len(loads) == 2 and quiet.busy == 0.05
    get()
    assert len(loads) == 2  # a quiet measurement is kept
