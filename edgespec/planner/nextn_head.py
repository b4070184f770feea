"""A target's own NextN (multi-token-prediction) layers, as the planner counts them.

A GGUF with ``<arch>.nextn_predict_layers`` > 0 carries NextN blocks after its trunk
(:class:`edgespec.runtime.gguf_facts.ModelFacts` counts them in ``n_layers``). llama.cpp
loads their weights only with ``load_mtp`` (the engine asks for it when the proposer
label holds ``mtp``), and the target's context caches only the trunk's layers; the MTP
context (:mod:`edgespec.runtime.mtp`) caches only the NextN layers, at the target's
context size and KV type. So:

    trunk(facts)              the target as loaded without its head: NextN blocks' weights
                              and KV left out (the layer indices, hence GPU placement, kept)
    head_items(facts, ...)    the head's weights and its MTP context's KV cache (in
                              :mod:`.memory`, beside the rest of the memory model)
    head_step_ratio(facts)    the prior cost of one head decode, in target steps: the bytes
                              it reads (its blocks, plus the output matrix when it has no
                              head of its own) over the trunk's, decode being memory-bound
"""
from __future__ import annotations

from dataclasses import replace

from ..runtime.gguf_facts import ModelFacts, block_index


def nextn_range(facts: ModelFacts) -> range:
    """The NextN blocks' indices (empty for most models)."""
    n = facts.nextn_predict_layers
    return range(facts.n_layers - n, facts.n_layers) if n > 0 else range(0)


def trunk(facts: ModelFacts) -> ModelFacts:
    """``facts`` without the NextN blocks' weights and KV heads (``facts`` itself when it
    has none)."""
    heads = nextn_range(facts)
    if not heads:
        return facts
    drop = set(heads)
    layer_bytes = tuple(0 if il in drop else b for il, b in enumerate(facts.layer_bytes))
    weight = facts.weight_bytes - facts.mtp_bytes
    share = weight / facts.weight_bytes if facts.weight_bytes else 1.0
    return replace(
        facts, layer_bytes=layer_bytes, weight_bytes=weight,
        file_bytes=facts.file_bytes - facts.mtp_bytes,
        n_head_kv_per_layer=tuple(0 if il in drop else h
                                  for il, h in enumerate(facts.n_head_kv_per_layer)),
        bytes_by_type={k: int(v * share) for k, v in facts.bytes_by_type.items()},
        swa_layers=tuple(w and il not in drop for il, w in enumerate(facts.swa_layers)),
        tensors=tuple(t for t in facts.tensors if block_index(t.name) not in drop),
        nextn_predict_layers=0)


def own_output_head(facts: ModelFacts) -> bool:
    """Whether the NextN blocks carry an output matrix of their own (shared_head_head)."""
    heads = set(nextn_range(facts))
    return any(block_index(t.name) in heads and t.name.endswith("shared_head_head.weight")
               for t in facts.tensors)


def head_step_ratio(facts: ModelFacts) -> float:
    """The prior cost of one head decode relative to a target step (see the module doc)."""
    output = facts.output_bytes or facts.token_embd_bytes  # tied: the embeddings' matrix
    read = facts.mtp_bytes + (0 if own_output_head(facts) else output)
    return read / max(facts.weight_bytes - facts.mtp_bytes, 1)
