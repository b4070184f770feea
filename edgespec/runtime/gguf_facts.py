"""What the planner needs to know about a model, read from its GGUF header only.

Nothing here loads weights. The header is parsed by :mod:`edgespec.runtime.gguf_header`
(a bounded reader: every count is checked against the bytes left in the file,
so a corrupt header is a :class:`ModelError`, never a crash or a huge
allocation); tensor sizes come from the ``gguf`` package's block-size table.
This module turns that into sizes and shapes: bytes by type and per layer, KV
heads and head dimensions, sliding-window layers, vocabulary, trained context.

Per-layer KV heads are taken from the shape of each layer's ``attn_k`` tensor
(what llama.cpp actually sizes its cache by), falling back to the metadata;
that covers architectures whose head counts vary by layer without needing the
metadata arrays' values.

Why not ``gguf.GGUFReader``: it materialises every tokenizer string as a numpy
view (about ten seconds for Qwen's 151,936-token vocabulary on this CPU), and
``edgespec plan`` should answer in well under a second.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import gguf

from ..errors import ModelError
from .gguf_header import ArrayInfo, TensorInfo, read_gguf_header

# Sliding-window layer pattern per architecture when the file does not carry one:
# every n-th layer is global, the others use the window (llama.cpp's defaults).
_DEFAULT_SWA_PATTERN = {
    "gemma2": 2, "gemma3": 6, "gemma3n": 5, "gemma-embedding": 6, "cohere2": 4,
    "exaone4": 4, "llama4": 4, "olmo2": 4, "openai-moe": 2, "gpt-oss": 2,
}


@dataclass(frozen=True)
class ModelFacts:
    """Sizes and shapes of one GGUF model, enough to plan memory and speed."""
    path: str
    file_bytes: int
    arch: str
    name: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    # per layer (some architectures vary KV heads by layer; 0 = no attention in that layer)
    n_head_kv_per_layer: tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    n_vocab: int
    n_merges: int                           # BPE merge rules (0 for SentencePiece vocabularies)
    # sliding-window attention: window size (0 = none) and which layers use it
    sliding_window: int
    swa_layers: tuple[bool, ...]
    weight_bytes: int                       # all tensors
    bytes_by_type: dict[str, int]           # e.g. {"Q4_K": ..., "Q6_K": ..., "F32": ...}
    layer_bytes: tuple[int, ...]            # tensors named blk.<i>.*
    token_embd_bytes: int
    output_bytes: int                       # output.weight (0 when tied to the embeddings)
    other_bytes: int                        # norms and anything not in a block
    n_tensors: int
    metadata: dict = field(default_factory=dict, repr=False, compare=False)
    # every tensor (name, shape, type, offset from data_offset, bytes): which weights a CPU
    # kernel repacks and which file pages stay mapped (edgespec.planner.repack)
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False, compare=False)
    data_offset: int = 0
    #: NextN (multi-token-prediction) blocks appended after the trunk (0: none); llama.cpp
    #: loads them only for an MTP context (edgespec.runtime.mtp), they count in n_layers
    nextn_predict_layers: int = 0

    @property
    def mtp_bytes(self) -> int:
        """Weights of the NextN blocks: the last ``nextn_predict_layers`` layers."""
        n = self.nextn_predict_layers
        return sum(self.layer_bytes[-n:]) if n > 0 else 0

    @property
    def n_head_kv(self) -> int:
        return max(self.n_head_kv_per_layer, default=0)

    @property
    def tied_embeddings(self) -> bool:
        return self.output_bytes == 0

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers)

    def kv_elems_per_token(self, layers: range | None = None, swa: bool | None = None) -> int:
        """K plus V elements one token occupies in the cache, over ``layers`` (default all).

        ``swa`` selects only sliding-window layers (True), only full layers (False), or both.
        """
        total = 0
        for il in layers if layers is not None else range(self.n_layers):
            if swa is not None and self.swa_layers[il] != swa:
                continue
            total += self.n_head_kv_per_layer[il] * (self.head_dim_k + self.head_dim_v)
        return total

    def summary(self) -> str:
        swa = (f", sliding window {self.sliding_window} on {self.n_swa_layers}/{self.n_layers} layers"
               if self.sliding_window else "")
        return (f"{self.name or Path(self.path).name} ({self.arch}): {self.n_layers} layers, "
                f"n_embd {self.n_embd}, {self.n_head}/{self.n_head_kv} heads (q/kv), "
                f"head dim {self.head_dim_k}, vocab {self.n_vocab}, trained ctx {self.n_ctx_train}"
                f"{swa}; weights {self.weight_bytes / 2**20:.0f} MiB")


_BLK = re.compile(r"^blk\.(\d+)\.")


def block_index(tensor_name: str) -> int | None:
    """The block a tensor belongs to (``blk.<i>.*``), None for the rest."""
    m = _BLK.match(tensor_name)
    return int(m.group(1)) if m else None


_ATTN_K = re.compile(r"^blk\.(\d+)\.attn_k\.weight$")


def _num(meta: dict, key: str, default=None):
    """A scalar number from the metadata, or ``default`` (bools and strings are not numbers)."""
    v = meta.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return default
    return int(v)


def read_facts(path: str | os.PathLike) -> ModelFacts:
    """The planner's view of a GGUF model; ModelError if the header is unusable."""
    info = read_gguf_header(path)
    path = str(path)
    meta = info.metadata
    arch = info.architecture
    if not arch:
        raise ModelError(f"{path}: the GGUF header has no general.architecture; "
                         "it is not a model llama.cpp can load")

    def req(key: str) -> int:
        v = _num(meta, f"{arch}.{key}")
        if v is None or v <= 0:
            raise ModelError(f"{path}: the GGUF header lacks a valid {arch}.{key}; "
                             "the file is corrupt or not a text model")
        return v

    n_layers = req("block_count")
    if n_layers > 10_000:
        raise ModelError(f"{path}: {arch}.block_count {n_layers} is implausible (corrupt header)")
    n_embd = req("embedding_length")
    n_ctx_train = req("context_length")
    n_ff = _num(meta, f"{arch}.feed_forward_length", 0)
    n_head = _num(meta, f"{arch}.attention.head_count", 0)
    head_k = _num(meta, f"{arch}.attention.key_length") or (n_embd // n_head if n_head else 0)
    head_v = _num(meta, f"{arch}.attention.value_length") or head_k
    if not (0 < head_k <= 1 << 16 and 0 < head_v <= 1 << 16):
        raise ModelError(f"{path}: the GGUF header gives no usable attention head size "
                         f"(head_count {n_head}, key_length {head_k})")
    kv_default = _num(meta, f"{arch}.attention.head_count_kv", n_head) or 0
    window = _num(meta, f"{arch}.attention.sliding_window", 0) or 0
    swa_layers = _swa_layers(meta, arch, n_layers, window)
    sizes = _TensorBytes(info.tensors, n_layers, head_k, kv_default)
    if sizes.total == 0:
        raise ModelError(f"{path}: the GGUF file holds no tensors; it is not a model")

    merges = meta.get("tokenizer.ggml.merges")
    n_merges = merges.length if isinstance(merges, ArrayInfo) else 0
    name = meta.get("general.name")
    return ModelFacts(
        path=path, file_bytes=info.file_size, arch=arch,
        name=name if isinstance(name, str) else "",
        n_layers=n_layers, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
        n_head_kv_per_layer=tuple(sizes.kv_heads), head_dim_k=head_k, head_dim_v=head_v,
        n_ctx_train=n_ctx_train, n_vocab=info.vocab_size or 0, n_merges=n_merges,
        sliding_window=window,
        swa_layers=swa_layers, weight_bytes=sizes.total,
        bytes_by_type=dict(sorted(sizes.by_type.items(), key=lambda kv: -kv[1])),
        layer_bytes=tuple(sizes.layer_bytes), token_embd_bytes=sizes.token_embd,
        output_bytes=sizes.output, other_bytes=sizes.other, n_tensors=len(info.tensors),
        metadata={k: v for k, v in meta.items() if not isinstance(v, ArrayInfo)},
        tensors=info.tensors, data_offset=info.data_offset,
        nextn_predict_layers=min(max(_num(meta, f"{arch}.nextn_predict_layers", 0) or 0, 0),
                                 n_layers),
    )


def _swa_layers(meta: dict, arch: str, n_layers: int, window: int) -> tuple[bool, ...]:
    """Which layers attend through the sliding window (none without one)."""
    if window <= 0:
        return (False,) * n_layers
    pattern = _num(meta, f"{arch}.attention.sliding_window_pattern")
    if pattern is None:  # absent, or a per-layer array whose values are not kept
        pattern = _DEFAULT_SWA_PATTERN.get(arch, 0)
    # llama.cpp: pattern 0 = every layer windowed, else the last of every `pattern` is global
    return tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layers))


class _TensorBytes:
    """The weights' bytes by quantization type, per block and outside the blocks, and each
    block's KV heads (from its attn_k shape; ``kv_default`` where it has none)."""

    def __init__(self, tensors, n_layers: int, head_k: int, kv_default: int) -> None:
        self.by_type: dict[str, int] = {}
        self.layer_bytes = [0] * n_layers
        self.kv_heads = [kv_default] * n_layers
        self.token_embd = self.output = self.other = self.total = 0
        for t in tensors:
            self._add(t, n_layers, head_k)

    def _add(self, t, n_layers: int, head_k: int) -> None:
        nb = t.nbytes
        self.total += nb
        tname = gguf.GGMLQuantizationType(t.ggml_type).name
        self.by_type[tname] = self.by_type.get(tname, 0) + nb
        il = block_index(t.name)
        if il is not None and il < n_layers:
            self.layer_bytes[il] += nb
            if _ATTN_K.match(t.name) and len(t.shape) >= 2:
                self.kv_heads[il] = t.shape[1] // head_k
        elif t.name == "token_embd.weight":
            self.token_embd += nb
        elif t.name == "output.weight":
            self.output += nb
        else:
            self.other += nb
