"""The pure parts of edgespec.runtime.hugepages: which ranges a load added, cut to blocks."""
from __future__ import annotations

from edgespec.runtime.hugepages import BLOCK, anon_ranges, blocks, subtract, thp_mode

MAPS = """\
55d2c0754000-55d2c37bf000 rw-p 00000000 00:00 0                          [heap]
7f3aad86d000-7f3af0000000 rw-p 00000000 00:00 0
7f3af05ac000-7f3b32990000 r--s 005ac000 fe:00 16040025                   /root/m.gguf
7f3b35600000-7f3b39600000 rw-p 00000000 00:00 0
7f3b39600000-7f3b39800000 r-xp 00000000 fe:00 1                          /usr/lib/libc.so
7f3b39800000-7f3b39a00000 ---p 00000000 00:00 0
"""


def test_thp_mode_reads_the_bracketed_choice():
    assert thp_mode("always [madvise] never\n") == "madvise"
    assert thp_mode("[always] madvise never") == "always"
    assert thp_mode("always madvise [never]") == "never"
    assert thp_mode("garbage") is None


def test_anon_ranges_are_private_writable_and_nameless():
    assert anon_ranges(MAPS.splitlines()) == [(0x7f3aad86d000, 0x7f3af0000000),
                                              (0x7f3b35600000, 0x7f3b39600000)]


def test_subtract_keeps_what_is_new_including_growth_and_merges():
    before = [(100, 200), (300, 400)]
    # a new range, one that grew at both ends, one merged across two old ones
    after = [(10, 50), (90, 210), (250, 450)]
    assert subtract(after, before) == [(10, 50), (90, 100), (200, 210), (250, 300), (400, 450)]
    assert subtract(before, before) == []
    assert subtract(after, []) == after


def test_blocks_shrink_inward_to_whole_huge_pages_and_drop_small_ranges():
    lo = 10 * BLOCK + 4096
    assert blocks([(lo, lo + 8 * BLOCK)], min_bytes=4 * BLOCK) == [(11 * BLOCK, 18 * BLOCK)]
    assert blocks([(lo, lo + 3 * BLOCK)], min_bytes=4 * BLOCK) == []
    assert blocks([(lo, lo + BLOCK)], min_bytes=0) == []  # holds no whole block


# --- what the configuration loads where huge pages are available (EngineConfig.loaded_as) ---

def test_unasked_a_repacking_cpu_load_reads_into_ram_where_huge_pages_are(monkeypatch):
    from edgespec.config import EngineConfig
    from edgespec.runtime import hugepages
    from edgespec.runtime.kernel import KernelConfig

    k = KernelConfig()
    for huge in (False, True):
        monkeypatch.setattr(hugepages, "available", lambda: huge)
        assert EngineConfig(target="t").loaded_as(k).use_mmap is not huge
        # asked either way, or a load whose weights are not all here, or not repacked: as is
        assert EngineConfig(target="t", use_mmap=True).loaded_as(k).use_mmap is True
        assert EngineConfig(target="t", use_mmap=False).loaded_as(k).use_mmap is False
        assert EngineConfig(target="t", n_gpu_layers=5).loaded_as(k).use_mmap is True
        assert EngineConfig(target="t").loaded_as(KernelConfig(repack=False)).use_mmap is True


def test_the_plan_says_why_the_weights_are_read_into_ram():
    from edgespec.planner.reasons import _kernel_reasons
    from edgespec.runtime.kernel import KernelConfig

    ram, mapped = KernelConfig(use_mmap=False), KernelConfig()
    assert "2 MiB pages" in _kernel_reasons(ram, ram, True)[1]
    assert "fits the budget" in _kernel_reasons(ram, mapped, True)[1]
    assert "mapped from the file" in _kernel_reasons(mapped, mapped, True)[1]
