"""How a long input splits into passes (runtime.kernel.pass_sizes): whole batches, and
never a last pass shorter than the kernels' minimum when the input allows one."""
from __future__ import annotations

import pytest

from edgespec.runtime.kernel import (FA_TILE_ROWS, KV_GGML_TYPE, MIN_PASS, ROW_GROUP,
                                     KernelConfig, min_pass, pass_sizes)


@pytest.mark.parametrize("least", [MIN_PASS, FA_TILE_ROWS])
@pytest.mark.parametrize("n", [1, 7, 8, 63, 64, 511, 512, 513, 530, 575, 576, 1024, 1030, 2049])
def test_passes_cover_the_input_in_batches_with_no_short_last_pass(n, least):
    sizes = pass_sizes(n, 512, least)
    assert sum(sizes) == n and all(0 < s <= 512 for s in sizes)
    # every pass but the last starts and ends on a row-group boundary
    assert all(s % ROW_GROUP == 0 for s in sizes[:-1])
    if n >= least:
        assert min(sizes) >= least
    else:
        assert sizes == [n]


def test_only_the_last_two_passes_change():
    assert pass_sizes(1030, 512, 64) == [512, 452, 66]
    assert pass_sizes(1100, 512, 64) == [512, 512, 76]
    assert pass_sizes(0, 512, 64) == []


def test_the_minimum_pass_follows_the_kv_cache_and_attention():
    assert min_pass(KV_GGML_TYPE["f16"], True) == FA_TILE_ROWS
    assert min_pass(KV_GGML_TYPE["q8_0"], True) == MIN_PASS
    assert min_pass(KernelConfig(kv_type="f16").kv_ggml_type, True) == 64
    assert min_pass(KernelConfig(kv_type="q8_0").kv_ggml_type, True) == 8
    assert KernelConfig(kv_type="f16").reproducible
    assert not KernelConfig(kv_type="f16", flash_attn=False).reproducible
