"""How llama.cpp computes for an engine: the kernel configuration a model is loaded and
its contexts are created with (validated once, a key for caches measured under it)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ensure

KV_TYPES = ("f16", "q8_0", "q4_0")
#: enum ggml_type values, for llama_context_params.type_k/type_v
KV_GGML_TYPE = {"f16": 1, "q8_0": 8, "q4_0": 2}

#: ggml-cpu's repacked matrix kernels evaluate a batch in groups of this many rows (gemm)
#: and the rows left over one by one (gemv), which round differently: a pass that starts
#: on a group boundary groups its rows as a pass from position 0 does
ROW_GROUP = 4
#: ... and a pass of fewer rows than this takes other matrix kernels again (Qwen2.5 Q4_K,
#: repacked: the rows of a 4-7 row pass differ from the same rows in a long pass; 8 and
#: more agree, tests/integration/test_kv_refresh_real.py probes it)
MIN_PASS = 8
#: flash attention over an F16 (or F32) KV cache takes ggml-cpu's tiled kernel for a pass
#: of at least this many query rows (GGML_FA_TILE_Q) and a one-row loop below it; the
#: tiled kernel computes a row the same whichever rows share its tile, so passes this long
#: compute every row alike (probed in tests/integration/test_kv_refresh_real.py)
FA_TILE_ROWS = 64


def min_pass(kv_ggml_type: int, flash_attn: bool) -> int:
    """The fewest rows a pass may hold and compute each row as any longer pass does."""
    f16_or_f32 = kv_ggml_type in (KV_GGML_TYPE["f16"], 0)  # 0: GGML_TYPE_F32
    return max(MIN_PASS, FA_TILE_ROWS if flash_attn and f16_or_f32 else 0)


def pass_sizes(n: int, n_batch: int, least: int, group: int = ROW_GROUP) -> list[int]:
    """How ``n`` input rows split into passes of at most ``n_batch``: whole batches, and a
    last pass of at least ``least`` rows when ``n`` allows it (whole row groups move to it
    from the pass before), so no pass of a long input takes a short pass's kernels.

    >>> pass_sizes(1030, 512, 8)
    [512, 508, 10]
    >>> pass_sizes(530, 512, 64)
    [464, 66]
    """
    if n <= 0:
        return []
    sizes = [n_batch] * (n // n_batch) + ([n % n_batch] if n % n_batch else [])
    short = least - sizes[-1]
    if len(sizes) > 1 and short > 0:
        moved = -(-short // group) * group
        if sizes[-2] - moved >= least:
            sizes[-2] -= moved
            sizes[-1] += moved
    return sizes



@dataclass(frozen=True)
class KernelConfig:
    """How llama.cpp computes: what decides speed, memory and batch invariance.

    ``repack`` (llama.cpp's ``use_extra_bufts``) keeps a repacked copy of the weights
    beside the mapped file: much cheaper verify passes on CPU, at the price of
    resident memory. Flash attention with a Q8_0 KV cache keeps single-token decodes
    on the same attention path as batches (docs/parity.md).
    """

    repack: bool = True
    flash_attn: bool = True
    kv_type: str = "q8_0"
    n_batch: int = 512
    use_mmap: bool = True

    def validate(self) -> "KernelConfig":
        ensure(self.kv_type in KV_TYPES,
               f"unknown KV cache type {self.kv_type!r}; choose one of {', '.join(KV_TYPES)}")
        ensure(self.n_batch >= 1, f"batch size must be >= 1 (got {self.n_batch})")
        ensure(self.flash_attn or self.kv_type == "f16",
               f"a {self.kv_type} KV cache needs flash attention (llama.cpp refuses a quantized "
               "V cache without it); use kv_type f16 or keep flash attention on")
        return self

    @property
    def exact_capable(self) -> bool:
        """Whether exact mode can run on it at all: only flash attention with a quantized KV
        cache keeps single-token decodes off the split-KV path at long context (docs/parity.md)."""
        return self.flash_attn and self.kv_type != "f16"

    @property
    def reproducible(self) -> bool:
        """Whether a prefill computes a row the same however the prompt splits into passes
        of at least :func:`min_pass` rows, so a warm KV cache gives a cold prefill's logits:
        flash attention on (without it attention's matrix products differ at every batch
        size, docs/parity.md)."""
        return self.flash_attn

    @property
    def kv_ggml_type(self) -> int:
        return KV_GGML_TYPE[self.kv_type]

    def key(self) -> str:
        """A short stable label for caches of what this configuration computes (speed,
        exactness, saved KV). Reading the weights into RAM instead of mapping them moves
        memory, not arithmetic, so ``use_mmap`` is not part of it."""
        return f"repack={int(self.repack)},fa={int(self.flash_attn)},kv={self.kv_type}"
