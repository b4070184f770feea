"""A tiny GGUF with a next-token-prediction (MTP) layer, built for the tests.

No MTP-capable model ships in a package this machine can install, so the tests write one
with the ``gguf`` package: llama.cpp's ``mimo2`` architecture (plain attention, a dense
FFN, one appended NextN block that llama.cpp runs through its real ``DECODER_MTP`` graph),
small dimensions, weights from a seeded RNG, and the tokenizer of smollm2-135m (copied from
its GGUF, so the model reads and writes real text).

The weights are shaped so that drafting is neither hopeless nor perfect. The trunk is
close to a bigram model (the attention and FFN outputs are small, so the context matters
only a little) and the MTP block copies the next token's embedding through ``eh_proj``, so
the head predicts what the target would say after that token; its own output head is the
target's plus noise, so some drafts are rejected. Acceptance here proves the plumbing, not
the speed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

N_EMBD = 64
N_HEAD = 2
N_HEAD_KV = 1
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 128
N_TRUNK = 2
N_NEXTN = 1
TRUNK_SCALE = 0.003 # how much the context moves the trunk's output
HEAD_NOISE = 0.05   # how far the MTP head's output matrix is from the target's


def _rng_matrix(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)


def _copy_tokenizer(w: Any, src: Path) -> int:
    """Copy every ``tokenizer.*`` key of ``src`` into writer ``w``; return the vocabulary size."""
    import gguf
    reader = gguf.GGUFReader(str(src))
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        w.add_key_value(key, value, vtype, sub_type=sub)
    return n_vocab


def _attention(w: Any, rng: np.random.Generator, il: int, scale: float) -> None:
    n_q, n_kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    qkv = _rng_matrix(rng, n_q + 2 * n_kv, N_EMBD, 0.3)
    w.add_tensor(f"blk.{il}.attn_qkv.weight", qkv)
    w.add_tensor(f"blk.{il}.attn_output.weight", _rng_matrix(rng, N_EMBD, n_q, scale))
    w.add_tensor(f"blk.{il}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))


def _ffn(w: Any, rng: np.random.Generator, il: int, scale: float) -> None:
    w.add_tensor(f"blk.{il}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor(f"blk.{il}.ffn_gate.weight", _rng_matrix(rng, N_FF, N_EMBD, 0.3))
    w.add_tensor(f"blk.{il}.ffn_up.weight", _rng_matrix(rng, N_FF, N_EMBD, 0.3))
    w.add_tensor(f"blk.{il}.ffn_down.weight", _rng_matrix(rng, N_EMBD, N_FF, scale))


def _nextn(w: Any, rng: np.random.Generator, il: int, output: np.ndarray) -> None:
    eh = np.zeros((N_EMBD, 2 * N_EMBD), dtype=np.float32)
    eh[:, :N_EMBD] = np.eye(N_EMBD, dtype=np.float32)  # [embedding of x_{t+1} ; h_t] -> the first
    eh[:, N_EMBD:] = _rng_matrix(rng, N_EMBD, N_EMBD, TRUNK_SCALE)
    w.add_tensor(f"blk.{il}.nextn.eh_proj.weight", eh)
    w.add_tensor(f"blk.{il}.nextn.enorm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor(f"blk.{il}.nextn.hnorm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor(f"blk.{il}.nextn.shared_head_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    noisy = output + _rng_matrix(rng, output.shape[0], output.shape[1], HEAD_NOISE)
    w.add_tensor(f"blk.{il}.nextn.shared_head_head.weight", noisy.astype(np.float16))


def _hparams(w: Any, n_vocab: int) -> None:
    arch = "mimo2"
    n_all = N_TRUNK + N_NEXTN
    w.add_uint32(f"{arch}.context_length", 4096)
    w.add_uint32(f"{arch}.embedding_length", N_EMBD)
    w.add_uint32(f"{arch}.block_count", n_all)
    w.add_uint32(f"{arch}.nextn_predict_layers", N_NEXTN)
    w.add_uint32(f"{arch}.feed_forward_length", N_FF)
    w.add_uint32(f"{arch}.expert_feed_forward_length", N_FF)
    w.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    w.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{arch}.rope.dimension_count", HEAD_DIM)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    # mimo2 always runs an interleaved-SWA cache and needs one SWA layer: the first,
    # with a window wider than any context the tests use (so it attends to everything)
    w.add_uint32(f"{arch}.attention.sliding_window", 8192)
    w.add_array(f"{arch}.attention.sliding_window_pattern", [True] + [False] * (n_all - 1))
    w.add_uint32(f"{arch}.vocab_size", n_vocab)
    w.add_uint32("general.file_type", 1)


def write_mtp_model(dst: Path, tokenizer_from: Path, seed: int = 30) -> Path:
    """Write the tiny mimo2 GGUF with one MTP layer to ``dst``."""
    import gguf
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(dst), "mimo2")
    w.add_name("edgespec tiny mtp test model")
    n_vocab = _copy_tokenizer(w, tokenizer_from)
    _hparams(w, n_vocab)
    tok = _rng_matrix(rng, n_vocab, N_EMBD, 1.0)
    output = _rng_matrix(rng, n_vocab, N_EMBD, 1.0)
    w.add_tensor("token_embd.weight", tok.astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", output.astype(np.float16))
    for il in range(N_TRUNK):
        _attention(w, rng, il, TRUNK_SCALE)
        _ffn(w, rng, il, TRUNK_SCALE)
    for il in range(N_TRUNK, N_TRUNK + N_NEXTN):
        _attention(w, rng, il, TRUNK_SCALE)
        _ffn(w, rng, il, TRUNK_SCALE)
        _nextn(w, rng, il, output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
