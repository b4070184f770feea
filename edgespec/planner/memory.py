"""The memory model: what a loaded engine holds, per component, in host RAM and on a GPU.

It describes the kernel configuration that runs (:class:`edgespec.runtime.kernel.KernelConfig`):

    runtime       the Python process with llama.cpp loaded (measured: 48 MiB), plus
                  the engine and its native proposers (measured: ~12 MiB)
    weights       with mmap: the mapped file's pages between the first and the last
                  tensor served from the mapping (MAP_POPULATE makes them resident);
                  without: each CPU tensor read into anonymous memory once. Layers
                  offloaded to the GPU (llama.cpp puts the *last* ``n_gpu_layers - 1``
                  blocks and the output layer there) leave host memory; the input
                  embeddings never do
    repacked      with ``repack`` (use_extra_bufts) the matrices llama.cpp has an
                  interleaved kernel for get a copy of their own (:mod:`.repack`);
                  with mmap their file pages stay resident beside it
    tokenizer     llama.cpp's vocabulary tables (measured: ~175 B per token
                  plus ~150 B per BPE merge rule)
    KV cache      padded context (256) x per-layer KV heads x (K + V head dims)
                  x bytes per element of the cache type (f16 2, q8_0 34/32,
                  q4_0 18/32); sliding-window layers hold only window + batch
                  cells unless the cache is "swa_full" (llama.cpp's default,
                  which speculative rollback needs)
    compute       llama.cpp *allocates* n_ubatch x (4 n_vocab + 8 n_embd) bytes
                  (the worst-case graph keeps logits for every batch row), but
                  on the CPU only the pages a pass touches become resident:
                  about 14 (n_ff + n_embd) bytes per prefill token plus 3 MiB.
                  Without flash attention the KQ scores (n_head x batch x context
                  floats) come on top, counted at their allocation. Accelerator
                  memory is committed at allocation, so there the full allocation counts.
    logits        verify passes ask for rows x n_vocab float32 logits, held by
                  llama.cpp's output buffer and by the engine's numpy copy
    proposers     the suffix cache's cap and the n-gram index (the engine
                  always loads the free proposers)

The host figure is what ``ps`` shows as RSS after a full-batch prefill and a verify
pass (docs/planner.md has estimate vs measured, in the engine's configuration).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..runtime.kernel import KV_GGML_TYPE, KV_TYPES, KernelConfig  # noqa: F401 (re-exported)
from ..runtime.device import Device, fmt_size, parse_size
from ..runtime.gguf_facts import ModelFacts
from . import repack as repackmod
from .nextn_head import nextn_range, trunk
from dataclasses import replace

# --- measured constants (llama-cpp-python 0.3.36, CPython 3.11; docs/planner.md) ------------
RUNTIME_BYTES = 48 * 2**20            # RSS of python + numpy + llama.cpp initialised
VOCAB_BYTES_PER_TOKEN = 175           # llama.cpp's vocabulary tables, anonymous memory...
VOCAB_BYTES_PER_MERGE = 150           # ...and its BPE merge ranks
ENGINE_BYTES = 12 * 2**20             # the engine on top of the backend (native lib, tables)
COMPUTE_BYTES_PER_TOKEN_UNIT = 14     # x (n_ff + n_embd) per batch token actually touched on CPU
COMPUTE_FIXED_BYTES = 3 * 2**20
# --- not measurable here (no GPU): llama.cpp's allocation rules plus a CUDA/Metal runtime reserve
GPU_RUNTIME_BYTES = 384 * 2**20

KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
CTX_PAD = 256
DEFAULT_BATCH = 512
K_MAX = 16
SUFFIX_CACHE_CAP = 64 * 2**20
NGRAM_BYTES_PER_TOKEN = 32
#: items that only use fills (not resident right after loading)
GROWS_WITH_USE = ("compute", "logits", "suffix cache", "n-gram index")


@dataclass(frozen=True)
class MemoryItem:
    name: str
    host: int
    device: int = 0
    note: str = ""


@dataclass(frozen=True)
class MemoryEstimate:
    items: tuple[MemoryItem, ...]

    @property
    def host(self) -> int:
        return sum(i.host for i in self.items)

    @property
    def device(self) -> int:
        return sum(i.device for i in self.items)

    @property
    def host_at_load(self) -> int:
        """Right after loading: no compute pages touched, no logits, proposer caches still empty."""
        return sum(i.host for i in self.items if not i.name.endswith(GROWS_WITH_USE))

    def without(self, *names: str) -> "MemoryEstimate":
        return MemoryEstimate(tuple(i for i in self.items if i.name not in names))

    def table(self, with_device: bool = False) -> str:
        rows = []
        for i in self.items:
            dev = f"  {fmt_size(i.device):>10}" if with_device else ""
            rows.append(f"  {i.name:<24} {fmt_size(i.host):>10}{dev}  {i.note}".rstrip())
        dev = f"  {fmt_size(self.device):>10}" if with_device else ""
        rows.append(f"  {'total':<24} {fmt_size(self.host):>10}{dev}")
        return "\n".join(rows)


def pad_ctx(n_ctx: int) -> int:
    return -(-n_ctx // CTX_PAD) * CTX_PAD


def gpu_layer_start(facts: ModelFacts, n_gpu_layers: int) -> int:
    """First block index llama.cpp places on the GPU (the output layer counts as one more)."""
    return max(facts.n_layers + 1 - max(n_gpu_layers, 0), 0)


def layer_kv_bytes(facts: ModelFacts, il: int, cells: int, kv_type: str) -> float:
    """One layer's KV cache: ``cells`` cells of its KV heads' K and V rows."""
    return (cells * facts.n_head_kv_per_layer[il] * (facts.head_dim_k + facts.head_dim_v)
            * KV_BYTES_PER_ELEMENT[kv_type])


def output_matrix_bytes(facts: ModelFacts) -> int:
    """The output layer where it is offloaded: its matrix, or a copy of the embeddings when
    they are tied (the output layer goes with the first offloaded "layer")."""
    return facts.output_bytes if facts.output_bytes else facts.token_embd_bytes


def kv_bytes(facts: ModelFacts, n_ctx: int, kv_type: str, n_batch: int = DEFAULT_BATCH,
             n_gpu_layers: int = 0, swa_full: bool = True) -> tuple[int, int]:
    """(host, device) bytes of one sequence's KV cache."""
    cells_full = pad_ctx(n_ctx)
    cells_swa = cells_full if swa_full else min(cells_full, pad_ctx(facts.sliding_window + n_batch))
    start = gpu_layer_start(facts, n_gpu_layers)
    host = dev = 0.0
    for il in range(facts.n_layers):
        b = layer_kv_bytes(facts, il, cells_swa if facts.swa_layers[il] else cells_full, kv_type)
        if il >= start:
            dev += b
        else:
            host += b
    return int(host), int(dev)


def weight_bytes(facts: ModelFacts, n_gpu_layers: int) -> tuple[int, int]:
    """(host, device) bytes of tensor data by placement alone (no repacked copies)."""
    if n_gpu_layers <= 0:
        return facts.weight_bytes, 0
    start = gpu_layer_start(facts, n_gpu_layers)
    on_gpu = sum(facts.layer_bytes[start:])
    host = facts.weight_bytes - on_gpu - facts.output_bytes
    return host, on_gpu + output_matrix_bytes(facts)


def host_weights(facts: ModelFacts, n_gpu_layers: int, kernel: KernelConfig,
                 isa: Sequence[str]) -> tuple[int, int]:
    """(weights resident on the host, repacked copies) under ``kernel`` (see :mod:`.repack`).

    From the tensor list when the facts carry one; otherwise by bytes per type, assuming
    every repackable matrix qualifies and the mapping spans all CPU tensors.
    """
    start = gpu_layer_start(facts, n_gpu_layers)
    if facts.tensors:
        mapped, anon, copies = repackmod.split_weights(facts, isa, kernel.repack, kernel.use_mmap,
                                                       start if n_gpu_layers > 0 else facts.n_layers + 1)
        return mapped + anon, copies
    host, _ = weight_bytes(facts, n_gpu_layers)
    if not kernel.repack:
        return host, 0
    kinds = repackmod.repackable_types(isa)
    share = sum(b for t, b in facts.bytes_by_type.items() if t in kinds) / max(facts.weight_bytes, 1)
    cpu_matrices = sum(facts.layer_bytes[:start]) + (facts.output_bytes if n_gpu_layers <= 0 else 0)
    copies = int(cpu_matrices * share)
    return (host if kernel.use_mmap else host - copies), copies


def compute_bytes(facts: ModelFacts, n_batch: int, rows: int, n_gpu_layers: int,
                  flash_attn: bool = True, n_ctx: int = 0) -> tuple[int, int]:
    """(host resident, device allocated) compute buffer bytes (see the module docstring)."""
    allocated = n_batch * (4 * facts.n_vocab + 8 * facts.n_embd)
    per_tok = COMPUTE_BYTES_PER_TOKEN_UNIT * (facts.n_ff + facts.n_embd)
    start = min(gpu_layer_start(facts, n_gpu_layers), facts.n_layers)
    cpu_share = start / facts.n_layers if facts.n_layers else 1.0
    touched = max(n_batch * per_tok, rows * (per_tok + 4 * facts.n_vocab))
    scores = 0 if flash_attn else 4 * facts.n_head * n_batch * pad_ctx(max(n_ctx, 1))
    host = int(min(allocated, touched * cpu_share) + scores * cpu_share + COMPUTE_FIXED_BYTES)
    dev = allocated + scores if n_gpu_layers > 0 else 0
    return host, dev


def kernel_note(kernel: KernelConfig) -> str:
    return (("repacked" if kernel.repack else "plain") + " weights, "
            + ("mmap" if kernel.use_mmap else "read into RAM") + ", flash attention "
            + ("on" if kernel.flash_attn else "off"))


def model_memory(label: str, facts: ModelFacts, *, n_ctx: int, kernel: KernelConfig,
                 n_gpu_layers: int, rows: int, isa: Sequence[str] = ()) -> list[MemoryItem]:
    kv_type, n_batch = kernel.kv_type, kernel.n_batch
    _, wd = weight_bytes(facts, n_gpu_layers)
    wh, copies = host_weights(facts, n_gpu_layers, kernel, isa)
    kh, kd = kv_bytes(facts, n_ctx, kv_type, n_batch, n_gpu_layers)
    ch, cd = compute_bytes(facts, n_batch, rows, n_gpu_layers, kernel.flash_attn, n_ctx)
    offl = f", {n_gpu_layers}/{facts.n_layers + 1} layers offloaded" if n_gpu_layers > 0 else ""
    swa = f", window {facts.sliding_window} on {facts.n_swa_layers} layers" if facts.sliding_window else ""
    how = "mapped file pages" if kernel.use_mmap else "read into RAM"
    items = [MemoryItem(f"{label} weights", wh, wd, f"{Path(facts.path).name}, {how}{offl}")]
    if kernel.repack:
        items.append(MemoryItem(f"{label} repacked", copies, 0,
                                "interleaved copy for the CPU kernels" if copies else
                                "no matrix has a repacked kernel on this CPU"))
    items += [
        MemoryItem(f"{label} tokenizer",
                   VOCAB_BYTES_PER_TOKEN * facts.n_vocab + VOCAB_BYTES_PER_MERGE * facts.n_merges, 0,
                   f"{facts.n_vocab} tokens" + (f", {facts.n_merges} merges" if facts.n_merges else "")),
        MemoryItem(f"{label} KV cache", kh, kd, f"{kv_type}, {pad_ctx(n_ctx)} cells{swa}"),
        MemoryItem(f"{label} compute", ch, cd,
                   f"batch {n_batch}" + ("" if kernel.flash_attn else ", KQ scores (no flash attention)")),
        MemoryItem(f"{label} logits", 2 * rows * facts.n_vocab * 4, 0,
                   f"{rows} row{'s' if rows > 1 else ''} x {facts.n_vocab}"),
    ]
    return items


def head_kv_bytes(facts: ModelFacts, n_ctx: int, kv_type: str) -> int:
    """The MTP context's KV cache: one layer's K and V per NextN block, every cell."""
    cells = pad_ctx(n_ctx)
    return int(sum(layer_kv_bytes(facts, il, cells, kv_type) for il in nextn_range(facts)))


def head_items(facts: ModelFacts, *, n_ctx: int, kernel: KernelConfig,
               n_gpu_layers: int = 0) -> list[MemoryItem]:
    """The head's weights (where its blocks are placed) and its MTP context's KV."""
    start = gpu_layer_start(facts, n_gpu_layers) if n_gpu_layers > 0 else facts.n_layers + 1
    on_dev = sum(facts.layer_bytes[il] for il in nextn_range(facts) if il >= start)
    kv = head_kv_bytes(facts, n_ctx, kernel.kv_type)
    n = facts.nextn_predict_layers
    blocks = f"{n} NextN block{'s' if n != 1 else ''}"
    return [
        MemoryItem("mtp head weights", facts.mtp_bytes - on_dev, on_dev,
                   f"{blocks}, loaded with load_mtp"),
        MemoryItem("mtp KV cache", 0 if on_dev else kv, kv if on_dev else 0,
                   f"{kernel.kv_type}, {pad_ctx(n_ctx)} cells, {blocks}"),
    ]


def estimate_memory(target: ModelFacts, *, n_ctx: int, kernel: KernelConfig | None = None,
                    kv_type: str | None = None, n_batch: int | None = None, n_gpu_layers: int = 0,
                    draft: ModelFacts | None = None, draft_gpu_layers: int = 0,
                    verify_rows: int = K_MAX + 1, suffix_cap: int = SUFFIX_CACHE_CAP,
                    free_proposers: bool = True, isa: Sequence[str] = (),
                    mtp_head: bool = False) -> MemoryEstimate:
    """Memory of a loaded engine: target (+ draft) with one context each, at their peak.

    A target with NextN (MTP) layers is counted without them (llama.cpp loads and caches
    only its trunk), unless ``mtp_head`` (the mtp proposer): then its head's weights and
    MTP context's KV are items of their own (:mod:`.heads`).

    ``kernel`` defaults to the engine's (:class:`KernelConfig`); ``kv_type``/``n_batch``
    override its fields. ``isa`` (the device's CPU flags) decides which matrices a
    repacking kernel copies; without it none is.
    """
    k = kernel or KernelConfig()
    if kv_type is not None or n_batch is not None:
        k = replace(k, kv_type=kv_type or k.kv_type, n_batch=n_batch or k.n_batch)
    items = [MemoryItem("runtime", RUNTIME_BYTES, 0, "python + llama.cpp")]
    items += model_memory("target", trunk(target), n_ctx=n_ctx, kernel=k,
                          n_gpu_layers=n_gpu_layers, rows=verify_rows, isa=isa)
    if mtp_head and target.nextn_predict_layers > 0:
        items += head_items(target, n_ctx=n_ctx, kernel=k, n_gpu_layers=n_gpu_layers)
    if draft is not None:
        # the draft model is loaded with llama.cpp's defaults except for the context's kernel
        items += model_memory("draft", draft, n_ctx=n_ctx, kernel=k, n_gpu_layers=draft_gpu_layers,
                              rows=1, isa=isa)
    if free_proposers:
        items.append(MemoryItem("engine", ENGINE_BYTES, 0, "engine, native proposers"))
        items.append(MemoryItem("suffix cache", suffix_cap, 0, "cap"))
        items.append(MemoryItem("n-gram index", NGRAM_BYTES_PER_TOKEN * n_ctx, 0, "per request"))
    if n_gpu_layers > 0 or (draft is not None and draft_gpu_layers > 0):
        items.append(MemoryItem("GPU runtime", 0, GPU_RUNTIME_BYTES, "driver, BLAS workspace (estimate)"))
    return MemoryEstimate(tuple(items))


def default_budgets(dev: Device, budget: int | str | None = None) -> tuple[int, int]:
    """(host, accelerator) budgets: what is free minus a safety margin, unless overridden."""
    if budget is not None:
        host = parse_size(budget)
    else:
        host = dev.ram_available - max(512 * 2**20, dev.ram_total // 20)
    gpu = dev.gpu
    vram = 0
    if gpu is not None:
        vram = gpu.free_bytes - max(256 * 2**20, gpu.total_bytes // 20)
    return max(host, 0), max(vram, 0)
