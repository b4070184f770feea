"""How llama.cpp computes for an engine: the kernel configuration a model is loaded and
its contexts are created with (validated once, a key for caches measured under it)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ensure

KV_TYPES = ("f16", "q8_0", "q4_0")
#: enum ggml_type values, for llama_context_params.type_k/type_v
KV_GGML_TYPE = {"f16": 1, "q8_0": 8, "q4_0": 2}



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
    def kv_ggml_type(self) -> int:
        return KV_GGML_TYPE[self.kv_type]

    def key(self) -> str:
        """A short stable label for caches of what this configuration computes (speed,
        exactness, saved KV). Reading the weights into RAM instead of mapping them moves
        memory, not arithmetic, so ``use_mmap`` is not part of it."""
        return f"repack={int(self.repack)},fa={int(self.flash_attn)},kv={self.kv_type}"
