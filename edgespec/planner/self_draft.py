"""The facts of a self-draft before it exists: the target with only some of its blocks
(:mod:`edgespec.proposers.self_draft` writes that file), for the memory and speed models."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from gguf import GGUF_DEFAULT_ALIGNMENT

from ..runtime.gguf_facts import ModelFacts, block_index


def self_draft_facts(target: ModelFacts, layers: Sequence[int]) -> ModelFacts:
    """``target`` keeping ``layers`` (its embeddings, output and norms too): a model of its
    own in memory (a separate file, mapped, with its own KV cache and repacked copies)."""
    kept = sorted(set(int(i) for i in layers))
    keep = set(kept)
    kept_tensors = sorted((t for t in target.tensors
                           if block_index(t.name) is None or block_index(t.name) in keep),
                          key=lambda t: t.offset)
    # the written file holds them back to back (GGUF's 32-byte alignment): the mapping the
    # memory model spans is this file's, not the target's with holes
    placed, at = [], 0
    for t in kept_tensors:
        placed.append(replace(t, offset=at))
        at += -(-t.nbytes // GGUF_DEFAULT_ALIGNMENT) * GGUF_DEFAULT_ALIGNMENT
    tensors = tuple(placed)
    layer_bytes = tuple(target.layer_bytes[i] for i in kept if i < len(target.layer_bytes))
    weight = sum(layer_bytes) + target.token_embd_bytes + target.output_bytes + target.other_bytes
    share = weight / target.weight_bytes if target.weight_bytes else 1.0
    return replace(
        target, path=f"{target.path} (self-draft, {len(kept)} of {target.n_layers} layers)",
        n_layers=len(kept), layer_bytes=layer_bytes, weight_bytes=weight,
        file_bytes=target.file_bytes - target.weight_bytes + weight,
        n_head_kv_per_layer=tuple(target.n_head_kv_per_layer[i] for i in kept
                                  if i < len(target.n_head_kv_per_layer)),
        swa_layers=tuple(target.swa_layers[i] for i in kept if i < len(target.swa_layers)),
        bytes_by_type={k: int(v * share) for k, v in target.bytes_by_type.items()},
        n_tensors=len(tensors) or target.n_tensors, tensors=tensors)
