"""Which weights llama.cpp's CPU backend repacks, and where the mapped file stays resident.

With ``use_extra_bufts`` (edgespec's ``KernelConfig.repack``) llama.cpp gives a weight
matrix an interleaved copy in the CPU_REPACK buffer when its type has a kernel for this
ISA and its row count fits the kernel's interleave (ggml-cpu/repack.cpp,
``ggml_repack_get_optimal_repack_type``, in the llama.cpp that llama-cpp-python 0.3.36
vendors). Only matrices used by MUL_MAT qualify: the token embeddings are read with
GET_ROWS and stay in the file's pages; a tied output layer gets its own repacked copy.
The copy has the same size as the original (the blocks are only interleaved).

With mmap (the default) the loader maps the whole file with MAP_POPULATE, reads the
tensors it repacks through the mapping, and afterwards unmaps only the stretches before
the first and after the last tensor that stays *in* the mapping. So a repacked weight in
the middle of the file is resident twice: once as file pages, once as its copy. Without
mmap every tensor is read into anonymous memory once, repacked or not.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import gguf

from ..runtime.gguf_facts import ModelFacts

#: type -> ((ISA flags all required, rows must divide by), ...), first match wins.
#: "asimd" is /proc/cpuinfo's name for NEON, "asimddp" for dotprod, "i8mm" for int8 matmul.
REPACK_RULES: dict[str, tuple[tuple[tuple[str, ...], int], ...]] = {
    "Q4_0": ((("avx2",), 8), (("asimd", "i8mm"), 4), (("asimd", "asimddp"), 4)),
    "Q4_K": ((("avx2",), 8), (("asimd", "i8mm"), 8), (("asimd", "asimddp"), 8)),
    "Q2_K": ((("avx512f",), 8),),
    "Q5_K": ((("asimd", "i8mm"), 8), (("asimd", "asimddp"), 8)),
    "Q6_K": ((("asimd", "i8mm"), 8), (("asimd", "asimddp"), 8)),
    "IQ4_NL": ((("avx2",), 8), (("asimd", "asimddp"), 4)),
    "MXFP4": ((("avx2",), 8), (("asimd", "asimddp"), 4)),
    "Q8_0": ((("asimd", "i8mm"), 4), (("asimd", "asimddp"), 4)),
}


def _flags(isa: Iterable[str]) -> set[str]:
    f = {s.lower() for s in isa}
    if "neon" in f:  # macOS and some kernels say neon where Linux says asimd
        f.add("asimd")
    return f


def repacks(type_name: str, rows: int, isa: Iterable[str]) -> bool:
    """Whether a 2-D MUL_MAT weight of this type and row count gets a repacked copy."""
    flags = _flags(isa)
    for need, multiple in REPACK_RULES.get(type_name, ()):
        if all(n in flags for n in need):
            return rows % multiple == 0
    return False


def repackable_types(isa: Iterable[str]) -> set[str]:
    flags = _flags(isa)
    return {t for t, rules in REPACK_RULES.items() if any(all(n in flags for n in need)
                                                           for need, _ in rules)}


def _layer_of(name: str, n_layers: int) -> int | None:
    """Block index of a tensor, n_layers for the output layer, None for the input side."""
    if name.startswith("blk."):
        try:
            return int(name.split(".", 2)[1])
        except ValueError:
            return None
    if name.startswith("output"):
        return n_layers
    return None


def split_weights(facts: ModelFacts, isa: Sequence[str], repack: bool, use_mmap: bool,
                  gpu_start: int) -> tuple[int, int, int]:
    """(file pages resident, anonymous weights, repacked copies) on the host, in bytes.

    ``gpu_start`` is the first block on the GPU (``n_layers + 1`` when none is); the output
    layer goes with the first offloaded one. Needs the tensor list (``facts.tensors``).
    """
    n = facts.n_layers
    in_mapping: list[tuple[int, int]] = []   # (file offset, end) of tensors served from the map
    anon = copies = 0
    for t in facts.tensors:
        layer = _layer_of(t.name, n)
        on_gpu = layer is not None and layer >= gpu_start
        if on_gpu:
            continue
        type_name = gguf.GGMLQuantizationType(t.ggml_type).name
        matmul = len(t.shape) == 2 and t.name != "token_embd.weight"
        if repack and matmul and repacks(type_name, t.shape[1], isa):
            copies += t.nbytes
        elif use_mmap:
            start = facts.data_offset + t.offset
            in_mapping.append((start, start + t.nbytes))
        else:
            anon += t.nbytes
    if facts.tied_embeddings and repack and gpu_start > n:
        emb = next((t for t in facts.tensors if t.name == "token_embd.weight"), None)
        if emb is not None and len(emb.shape) == 2 and repacks(
                gguf.GGMLQuantizationType(emb.ggml_type).name, emb.shape[1], isa):
            copies += emb.nbytes  # the output layer's own repacked duplicate
    mapped = 0
    if in_mapping:
        first = min(a for a, _ in in_mapping)
        last = max(b for _, b in in_mapping)
        mapped = last - first  # MAP_POPULATE: everything between stays resident
    return mapped, anon, copies
