"""planner.kernels: the default mode's kernel configuration, chosen by measurement and cached.

The fake model's contexts advance a fake clock by a cost that depends on their KV type,
flash attention and pass size, so which candidate wins is known in advance."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from dataclasses import replace

import pytest

from edgespec.calibration import cache, cpu, curve
from edgespec.runtime.kernel import KV_GGML_TYPE, KernelConfig
from edgespec.planner import kernels
from fakes import FakeModel

F16, Q8, Q4 = KV_GGML_TYPE["f16"], KV_GGML_TYPE["q8_0"], KV_GGML_TYPE["q4_0"]


class Clocked(FakeModel):
    """Each decode of n tokens costs costs[key] * (1 + 0.5 * (min(n, 8) - 1)) fake seconds,
    plus bulk[key] for every token past the eighth (a prompt's), key (type_k, flash_attn)."""

    def __init__(self, costs, path: Path, bulk=None):
        super().__init__(name=path.name)
        self.path = path
        self.now = 0.0
        self.costs = costs
        self.bulk = bulk or {}
        self.opened: list[tuple[int, int]] = []

    def new_context(self, n_ctx, n_batch=512, n_threads=None, flash_attn=1, type_k=None, **kw):
        ctx = super().new_context(n_ctx, n_batch, n_threads, flash_attn=flash_attn, type_k=type_k, **kw)
        key = (type_k, flash_attn)
        self.opened.append(key)

        def tick(_ctx, tokens, _pos0):
            n = len(tokens)
            self.now += (self.costs[key] * (1 + 0.5 * (min(n, 8) - 1))
                         + self.bulk.get(key, 0.0) * max(0, n - 8))
        ctx.on_decode = tick
        return ctx

    def clock(self) -> float:
        return self.now


class _Quiet:
    def share(self) -> float:
        return 0.0


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """This machine's real load must not decide whether a cached choice is re-measured."""
    monkeypatch.setattr(cpu, "CpuWatch", _Quiet)
    monkeypatch.setattr(cpu, "machine_busy", lambda seconds=0.3: 0.0)


@pytest.fixture
def model(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)
    # F16 is fastest here
    return Clocked({(F16, 1): 0.025, (Q8, 1): 0.033}, f)


def _measured(model, tmp_path):
    """A choice measured into a fresh home: the arguments that read it again, it, its file."""
    kw = dict(n_threads=2, home=tmp_path / "home", build="b1", depths=(64,), repeats=1,
              clock=model.clock)
    first = kernels.load_or_measure(model, **kw)
    return kw, first, cache.cache_path(first.key, kw["home"])


def test_choose_takes_the_lowest_runnable_score_and_keeps_the_layout():
    fast = kernels.KernelTiming("q4_0", True, {256: 0.02, 1024: 0.03}, {256: 0.05, 1024: 0.06})
    slow = kernels.KernelTiming("q8_0", True, {256: 0.02, 1024: 0.04}, {256: 0.05, 1024: 0.06})
    got = kernels.choose([slow, fast], KernelConfig(kv_type="q8_0", repack=False))
    assert (got.kv_type, got.flash_attn, got.repack) == ("q4_0", True, False)
    assert kernels.choose([]) == kernels.FALLBACK
    assert kernels.FALLBACK.exact_capable
    # the verify pass counts too: equal steps, a cheaper pass wins
    cheap = kernels.KernelTiming("q8_0", True, {256: 0.02}, {256: 0.04})
    dear = kernels.KernelTiming("q4_0", True, {256: 0.02}, {256: 0.05})
    assert kernels.choose([dear, cheap]).kv_type == "q8_0"
    # an F16 cache with flash attention runs (a warm prefill computes it in passes of 64+
    # rows, as a cold one does); never attention without flash attention, however fast: a
    # warm KV cache would change a greedy text
    f16 = kernels.KernelTiming("f16", True, {256: 0.01}, {256: 0.02}, {256: 0.001})
    assert kernels.choose([f16, dear]).kv_type == "f16"
    no_fa = kernels.KernelTiming("f16", False, {256: 0.005}, {256: 0.01}, {256: 0.001})
    assert kernels.choose([no_fa, dear]).kv_type == "q4_0"
    assert kernels.choose([no_fa]) == kernels.FALLBACK


def test_measure_times_every_candidate_at_every_depth_and_runs_the_fastest_runnable(model):
    choice = kernels.measure(model, n_threads=2, depths=(64, 128), repeats=2, clock=model.clock)
    assert choice.source == "measured"
    assert (choice.kernel.kv_type, choice.kernel.flash_attn) == ("f16", True)  # the fastest
    # never attention without flash attention: batch-dependent at every size
    assert sorted(model.opened) == sorted([(F16, 1), (Q8, 1)])
    assert all(c.closed for c in model.contexts)
    t = choice.timing(KernelConfig(kv_type="q8_0"))
    assert t.step == {64: pytest.approx(0.033), 128: pytest.approx(0.033)}
    assert t.pass_[64] == pytest.approx(0.033 * 2.5)
    lines = choice.describe()
    assert len(lines) == 2
    assert lines[0].startswith("* KV f16  flash attention on") and "not run" not in lines[0]
    assert lines[1].startswith("  KV q8_0 flash attention on") and "not run" not in lines[1]
    # a candidate without flash attention is shown, never run
    no_fa = replace(choice, timings=(*choice.timings, kernels.KernelTiming(
        "f16", False, {64: 0.001, 128: 0.001}, {64: 0.002, 128: 0.002})))
    assert "not run" in no_fa.describe()[0]


def test_the_prompt_a_request_computes_first_weighs_in_the_choice(tmp_path):
    """A KV type whose step is a little faster loses to one that prefills much faster
    (on this CPU F16 against Q8_0: ggml-cpu has a tiled flash-attention kernel for F16
    batches only; here two runnable types stand in)."""
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)
    m = Clocked({(Q4, 1): 0.031, (Q8, 1): 0.030}, f, bulk={(Q4, 1): 0.018, (Q8, 1): 0.026})
    cands = (KernelConfig(kv_type="q4_0"), KernelConfig(kv_type="q8_0"))
    choice = kernels.measure(m, n_threads=2, candidates=cands, depths=(64, 128), repeats=2,
                             clock=m.clock)
    assert (choice.kernel.kv_type, choice.kernel.flash_attn) == ("q4_0", True)
    q8 = choice.timing(KernelConfig(kv_type="q8_0"))
    # 0 -> 64, then 64 -> 128: the first pass of each context is a warm-up, never timed
    assert q8.prefill[64] == pytest.approx((0.030 * 4.5 + 0.026 * 56) / 64)
    assert q8.prefill[128] == pytest.approx((0.030 * 4.5 + 0.026 * 56) / 64)
    assert q8.step[128] < choice.timing(KernelConfig(kv_type="q4_0")).step[128]
    assert "prompt 56 tok/s up to 128" in choice.describe()[0]
    # without the prompt term the faster step would have won
    bare = [kernels.KernelTiming(t.kv_type, t.flash_attn, t.step, t.pass_) for t in choice.timings]
    assert kernels.choose(bare).kv_type == "q8_0"


def test_a_choice_cached_before_prompts_were_timed_is_measured_again(model, tmp_path):
    kw, first, path = _measured(model, tmp_path)
    d = json.loads(path.read_text())
    d["format"] = 2
    for t in d["timings"]:
        del t["prefill"]
    path.write_text(json.dumps(d))
    opened = len(model.opened)
    with pytest.warns(curve.CalibrationWarning, match=r"predates .*format 2, now 3"):
        again = kernels.load_or_measure(model, **kw)
    assert len(model.opened) == 2 * opened and again.timings[0].prefill


def test_the_choice_is_cached_and_a_corrupt_or_stale_file_is_measured_again(model, tmp_path):
    kw, first, path = _measured(model, tmp_path)
    home = kw["home"]
    opened = len(model.opened)
    again = kernels.load_or_measure(model, **kw)
    assert len(model.opened) == opened and again.kernel == first.kernel  # read, not measured
    assert kernels.cached(model.path, n_threads=2, home=home, build="b1").kernel == first.kernel
    path.write_text("{not json", encoding="utf-8")
    with pytest.warns(curve.CalibrationWarning, match="unreadable"):
        kernels.load_or_measure(model, **kw)
    assert len(model.opened) == 2 * opened
    with pytest.warns(curve.CalibrationWarning, match="another llama.cpp build"):
        kernels.load_or_measure(model, **{**kw, "build": "b2"})
    assert len(model.opened) == 3 * opened
    # the planner's read never measures and never warns: the fallback until measured
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = kernels.cached(model.path, n_threads=2, home=home, build="b3")
    assert got.source == "default" and got.kernel == kernels.FALLBACK


def test_a_choice_measured_under_load_is_measured_again_once_quiet(model, tmp_path, monkeypatch):
    kw, first, path = _measured(model, tmp_path)
    home = kw["home"]
    d = json.loads(path.read_text())
    d["busy"] = 0.9
    path.write_text(json.dumps(d))
    opened = len(model.opened)
    monkeypatch.setattr(cpu, "machine_busy", lambda seconds=0.3: 0.9)
    kernels.load_or_measure(model, **kw)  # still busy: used as it is
    assert len(model.opened) == opened
    assert "measured again once the machine is quiet" in kernels.load_cached(first.key, home).describe()[-1]
    monkeypatch.setattr(cpu, "machine_busy", lambda seconds=0.3: 0.0)
    kernels.load_or_measure(model, **kw)
    assert len(model.opened) == 2 * opened


def test_bad_measurement_arguments_are_refused(model):
    with pytest.raises(ValueError):
        kernels.measure(model, depths=(), clock=model.clock)
    with pytest.raises(ValueError):
        kernels.measure(model, repeats=0, clock=model.clock)
