"""A tiny EAGLE-3 draft GGUF for smollm2-135m (arch ``llama``, n_embd 576, 30 layers), built
for the tests.

No EAGLE-3 GGUF can be obtained here, so the tests write one with the ``gguf`` package:
llama.cpp's ``eagle3`` architecture (the ``fc`` feature fusion, one decoder layer reading
``(token, g)`` pairs) at the target's hidden size, so it borrows the target's token
embeddings through ``ctx_other``; the tokenizer is the target's (copied from its GGUF).

The weights are chosen, not trained, so that drafting is neither hopeless nor perfect:
``fc`` passes on only the first target layer's input (layer 0: the embedding of the token
at that position), and the decoder's one attention layer is an induction head: the query
(the input token ``t_{P+1}``) looks for an earlier position whose target token was the
same, and copies the token that followed it there (the value), which the draft's own
output head (the target's embeddings, row-normalised) reads back. Repeated text gets its
first draft token right, new text mostly wrong; a chained draft step carries the previous
step's state in its residual, so it often repeats the token before. Verification sees
both accepts and rejects. Acceptance here proves the plumbing (the features reach the
head in order, the KV stays in step), not speed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mtp_model import _copy_tokenizer

N_EMBD = 576
N_HEAD = 9
HEAD_DIM = 64
N_FF = 64
N_ROT = 2             # only each head's first two dims are rotated; the match uses the rest
LAYERS = (0, 15, 29)  # smollm2-135m has 30 layers
SHARPNESS = 3.0       # query scale: how hard the induction head picks its match
G_SCALE = 0.1         # fc's gain: the raw g stays small beside the copied value


def _orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def _embeddings(target: Path) -> np.ndarray:
    import gguf
    from gguf.quants import dequantize
    for t in gguf.GGUFReader(str(target)).tensors:
        if t.name == "token_embd.weight":
            return dequantize(t.data, t.tensor_type).reshape(-1, N_EMBD).astype(np.float32)
    raise ValueError(f"{target} has no token_embd.weight")


def _head_rows(m: np.ndarray) -> np.ndarray:
    """``m`` with the rotated dims of every head zeroed (RoPE would scramble the match)."""
    out = m.copy()
    for h in range(N_HEAD):
        out[h * HEAD_DIM:h * HEAD_DIM + N_ROT] = 0
    return out


def write_eagle3_model(dst: Path, target: Path, *, seed: int = 30,
                       layers: Sequence[int] = LAYERS, target_hidden: int = N_EMBD,
                       tokenizer_from: Path | None = None, own_output: bool = True,
                       d2t: np.ndarray | None = None) -> Path:
    """Write the tiny EAGLE-3 draft for ``target`` (smollm2-135m) to ``dst``. The keywords
    make the broken drafts the refusal tests need: ``layers`` (eagle3.target_layers),
    ``target_hidden`` (another target's hidden size), ``tokenizer_from`` (another
    vocabulary, borrowing the output head), ``d2t`` (a draft-to-target id map; the own
    output head then has one row per entry)."""
    import gguf
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(dst), "eagle3")
    w.add_name("edgespec tiny eagle3 test draft")
    n_vocab = _copy_tokenizer(w, tokenizer_from or target)
    arch = "eagle3"
    w.add_uint32(f"{arch}.context_length", 8192)
    w.add_uint32(f"{arch}.embedding_length", N_EMBD)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_uint32(f"{arch}.feed_forward_length", N_FF)
    w.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    w.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{arch}.rope.dimension_count", N_ROT)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_array(f"{arch}.target_layers", [int(x) for x in layers])
    w.add_uint32(f"{arch}.target_hidden_size", target_hidden)
    w.add_bool(f"{arch}.norm_before_residual", False)
    w.add_uint32("general.file_type", 1)

    a = _orthogonal(rng, N_EMBD)      # fc: the target's embedding, turned by A
    r = _orthogonal(rng, N_EMBD)      # the query/key projection (per head: 64 rows)
    rv = _orthogonal(rng, N_EMBD)     # the value projection, undone by attn_output
    fc = np.zeros((N_EMBD, 3 * target_hidden), np.float32)
    fc[:, :min(N_EMBD, target_hidden)] = (G_SCALE * a)[:, :min(N_EMBD, target_hidden)]
    w.add_tensor("fc.weight", fc)
    zeros = np.zeros((N_EMBD, N_EMBD), np.float32)
    rk = _head_rows(r)
    w.add_tensor("blk.0.attn_q.weight", np.concatenate([SHARPNESS * rk, zeros], axis=1))
    w.add_tensor("blk.0.attn_k.weight", np.concatenate([zeros, rk @ a.T], axis=1))
    w.add_tensor("blk.0.attn_v.weight", np.concatenate([rv, zeros], axis=1))
    w.add_tensor("blk.0.attn_output.weight", rv.T.copy())
    ones = np.ones(N_EMBD, np.float32)
    for name in ("attn_norm", "attn_norm_2", "ffn_norm"):
        w.add_tensor(f"blk.0.{name}.weight", ones)
    w.add_tensor("blk.0.ffn_gate.weight", (rng.standard_normal((N_FF, N_EMBD)) * 0.1).astype(np.float32))
    w.add_tensor("blk.0.ffn_up.weight", (rng.standard_normal((N_FF, N_EMBD)) * 0.1).astype(np.float32))
    w.add_tensor("blk.0.ffn_down.weight", (rng.standard_normal((N_EMBD, N_FF)) * 1e-3).astype(np.float32))
    w.add_tensor("output_norm.weight", ones)
    if own_output:
        e = _embeddings(target)
        out = e / np.linalg.norm(e, axis=1, keepdims=True).clip(1e-6)
        if d2t is not None:
            out = out[:len(d2t)]
        w.add_tensor("output.weight", out.astype(np.float16))
    if d2t is not None:
        w.add_tensor("d2t", np.asarray(d2t, dtype=np.int64))
    assert n_vocab > 0
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def write_plain_gguf(dst: Path, target: Path) -> Path:
    """A tiny ordinary model (arch llama) with the target's tokenizer: not an EAGLE-3 draft."""
    import gguf
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(dst), "llama")
    n_vocab = _copy_tokenizer(w, target)
    for key, value in (("context_length", 512), ("embedding_length", 64), ("block_count", 1),
                       ("feed_forward_length", 64), ("attention.head_count", 2),
                       ("attention.head_count_kv", 2)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    t: dict[str, Any] = {
        "token_embd.weight": (n_vocab, 64), "output_norm.weight": (64,),
        "blk.0.attn_norm.weight": (64,), "blk.0.attn_q.weight": (64, 64),
        "blk.0.attn_k.weight": (64, 64), "blk.0.attn_v.weight": (64, 64),
        "blk.0.attn_output.weight": (64, 64), "blk.0.ffn_norm.weight": (64,),
        "blk.0.ffn_gate.weight": (64, 64), "blk.0.ffn_up.weight": (64, 64),
        "blk.0.ffn_down.weight": (64, 64)}
    for name, shape in t.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
