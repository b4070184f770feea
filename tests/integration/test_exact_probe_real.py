"""The exactness probe on real models: which verify passes give bitwise the plain path's
logits on this device (docs/parity.md measured the same by hand)."""
from __future__ import annotations

import pytest

from edgespec.runtime.model import load_model
from edgespec.calibration import cache as calibration, cpu, measuring
from edgespec.runtime.kernel import KernelConfig


@pytest.fixture(scope="module")
def smollm(model_path):
    m = load_model(model_path("smollm2-135m"), use_extra_bufts=True)
    yield m
    m.close()


def test_smollm2_q4_1_is_exact_at_every_size(smollm):
    # Q4_1 weights take no batch-dependent kernel; flash attention with a Q8_0 cache keeps
    # single-token decodes on the batches' attention path at long context too
    assert measuring.probe_exactness(smollm, n_threads=1, kernel=KernelConfig()) == 16


def test_exact_cap_is_probed_once_and_cached_with_the_calibration(smollm, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "machine_busy", lambda: 0.0)  # the cache must answer
    # ... also for a curve timed while other processes ran (re-measured when quiet, by design)
    monkeypatch.setattr(cpu.CpuWatch, "share", lambda self: 0.0)
    kernel = KernelConfig()
    assert calibration.exact_cap(smollm, kernel, 1, home=tmp_path) == 15
    cal = calibration.cached(smollm.path, n_threads=1, kernel=kernel, home=tmp_path)
    assert cal is not None and cal.exact_max_tokens == 16
    assert cal.device["kernel"] == kernel.key() and cal.device["threads"] == "1"
    monkeypatch.setattr(measuring, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert calibration.exact_cap(smollm, kernel, 1, home=tmp_path) == 15


@pytest.mark.slow
def test_qwen_repacked_weights_are_exact_below_the_4_column_gemm(model_path):
    # Q4_K/Q6_K repacked: gemv below 4 columns, gemm from 4 (docs/parity.md)
    m = load_model(model_path("qwen-1.5b"), use_extra_bufts=True)
    try:
        assert measuring.probe_exactness(m, n_threads=2, kernel=KernelConfig()) == 3
    finally:
        m.close()
