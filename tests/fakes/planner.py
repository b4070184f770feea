"""Synthetic models and devices for the planner's tests: facts shaped like the real
Qwen2.5-Coder 1.5B / 0.5B Q4_K_M headers, a CPU and a GPU box, a flat GPU-like curve."""
from __future__ import annotations

from edgespec.runtime import device as devmod
from edgespec.runtime.device import Device
from edgespec.runtime.gguf_facts import ModelFacts

GiB, MiB = 2**30, 2**20


def facts(name="target", layers=28, embd=1536, ff=8960, kv=2, hd=128, vocab=151936, merges=151387,
          layer_bytes=29_990_912, embd_bytes=131_272_704, out_bytes=191_439_360, ctx=32768,
          window=0, swa=None) -> ModelFacts:
    """Shaped like the real Qwen2.5-Coder-1.5B Q4_K_M header (the defaults)."""
    weights = layers * layer_bytes + embd_bytes + out_bytes + 6144
    return ModelFacts(
        path=f"/models/{name}.gguf", file_bytes=weights + 6_000_000, arch="qwen2", name=name,
        n_layers=layers, n_embd=embd, n_ff=ff, n_head=12, n_head_kv_per_layer=(kv,) * layers,
        head_dim_k=hd, head_dim_v=hd, n_ctx_train=ctx, n_vocab=vocab, n_merges=merges,
        sliding_window=window, swa_layers=swa or (False,) * layers, weight_bytes=weights,
        bytes_by_type={"Q4_K": weights}, layer_bytes=(layer_bytes,) * layers,
        token_embd_bytes=embd_bytes, output_bytes=out_bytes, other_bytes=6144, n_tensors=339)


QWEN_15 = facts()
QWEN_05 = facts("draft", layers=24, embd=896, ff=4864, hd=64, layer_bytes=10_883_840,
                embd_bytes=93_592_576, out_bytes=144_643_072)


def cpu(ram_available=20 * GiB, ram_total=24 * GiB, synthetic=True, speed=None) -> Device:
    return Device(name="test cpu", cpu_model="test", cores=2, logical_cpus=2, isa=("avx2",),
                  ram_total=ram_total, ram_available=ram_available, synthetic=synthetic,
                  speed=speed or {})


def gpu(vram_free, ram_available=20 * GiB, speed=None) -> Device:
    return Device(name="test gpu box", cpu_model="test", cores=8, logical_cpus=16, isa=("avx2",),
                  ram_total=32 * GiB, ram_available=ram_available, synthetic=True,
                  accelerators=(devmod.Accelerator("GPU0", "gpu", vram_free, vram_free + GiB),),
                  speed=speed or {})


FAST_GPU = {"verify_costs": {"2": 1.02, "4": 1.05, "8": 1.1, "16": 1.25}, "step_ms": 8,
            "draft_step_ratio": 0.15}
