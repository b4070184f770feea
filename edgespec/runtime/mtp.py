"""llama.cpp's multi-token-prediction (MTP) context: a target's own NextN head as a drafter.

A GGUF whose ``<arch>.nextn_predict_layers`` is positive carries NextN blocks after its
trunk. Loaded with ``load_mtp`` (:func:`edgespec.runtime.model.load_model`), the same
weights serve two contexts: the target's (the trunk) and an MTP context
(``LLAMA_CONTEXT_TYPE_MTP``), whose graph (``DECODER_MTP``) runs one NextN block. Its
input at position ``p`` is the token ``x_p`` paired with the target's pre-norm hidden
state after position ``p - 1`` (``h_nextn``); its output is logits for position ``p + 1``
and a hidden state of its own that feeds the next draft step.

The target's hidden states are a by-product of its verify pass: :class:`NextnTap` turns on
``llama_set_embeddings_nextn`` for the target context (unmasked: one row per batch entry)
and copies the rows out after every decode, keyed by sequence and position.

``llama_set_embeddings_nextn`` and its getters live in llama.cpp's staging header
(``src/llama-ext.h``), bound by their mangled names in :mod:`edgespec.runtime.staging`. The
batch carries a hidden row with ``llama_batch_ext_set_embd_token`` (what llama.cpp's
``common_batch`` does); ``llama_batch_ext_set_embd_state`` is still a stub returning false.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..errors import EdgespecError
from .backend import ll as _ll, recent_log
from .context import Context
from .model import Model
from .staging import FloatP as _FloatP, staging as _staging

def n_layer_nextn(model: Model) -> int:
    """NextN (MTP) blocks the loaded model has (0 for most models)."""
    return int(_ll.llama_model_n_layer_nextn(model._m))


class NextnTap:
    """The target's hidden states (``h_nextn``) from its decodes, by (sequence, position).

    Attached to a target :class:`Context` (``ctx.nextn_tap``), it is called after every
    ``llama_decode`` of that context with the batch just evaluated. A decode at positions
    ``a..b`` of a sequence makes every row past ``b`` stale (the target trimmed them), so
    those are dropped. Readers forget what they no longer need (:meth:`forget_below`).
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.n_embd = ctx.model.n_embd
        self.rows: dict[int, dict[int, np.ndarray]] = {}
        _staging("set_nextn")(ctx._c, True, False)
        ctx.nextn_tap = self

    def __call__(self, handle: Any, batch: Any, n: int) -> None:
        ptr = _staging("get_nextn")(handle)
        if not ptr or n <= 0:
            return
        h = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))
        last: dict[int, int] = {}
        for i in range(n):
            seq, pos = int(batch.seq_id[i][0]), int(batch.pos[i])
            self.rows.setdefault(seq, {})[pos] = h[i].copy()
            last[seq] = max(last.get(seq, -1), pos)
        for seq, top in last.items():
            rows = self.rows[seq]
            for pos in [p for p in rows if p > top]:
                del rows[pos]

    def row(self, seq: int, pos: int) -> np.ndarray | None:
        return self.rows.get(seq, {}).get(pos)

    def forget_below(self, seq: int, pos: int) -> None:
        rows = self.rows.get(seq, {})
        for p in [p for p in rows if p < pos]:
            del rows[p]

    def detach(self) -> None:
        if getattr(self.ctx, "nextn_tap", None) is self:
            self.ctx.nextn_tap = None
            if not getattr(self.ctx, "_closed", True):
                _staging("set_nextn")(self.ctx._c, False, False)
        self.rows.clear()


def _mtp_params(target: Context, n_ctx: int, n_batch: int, flash_attn: int,
                type_k: int, type_v: int) -> Any:
    p = _ll.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = n_batch
    p.n_ubatch = n_batch
    p.n_seq_max = 1
    p.n_threads = target.n_threads
    p.n_threads_batch = target.n_threads
    p.flash_attn_type = flash_attn
    p.no_perf = True
    p.type_k = type_k
    p.type_v = type_v
    p.ctx_type = _ll.LLAMA_CONTEXT_TYPE_MTP
    p.ctx_other = target._c
    return p


class MtpContext:
    """The MTP context of a target loaded with its NextN layers: decode (token, hidden row)
    pairs at positions of sequence 0; get the logits and hidden state of the last one."""

    def __init__(self, target: Context, n_batch: int = 64, flash_attn: int = 1,
                 type_k: int = 8, type_v: int = 8) -> None:
        model = target.model
        if not getattr(model, "load_mtp", False) or n_layer_nextn(model) <= 0:
            raise EdgespecError(f"{model.path.name} was not loaded with MTP layers")
        self.model, self.n_ctx = model, target.n_ctx
        self.n_embd, self.n_vocab = model.n_embd, model.n_vocab
        params = _mtp_params(target, target.n_ctx, max(1, min(n_batch, target.n_ctx)),
                             flash_attn, type_k, type_v)
        handle = _ll.llama_init_from_model(model._m, params)
        if not handle:
            raise EdgespecError(f"llama.cpp could not create the MTP context of "
                                f"{model.path.name}: {recent_log(4)}")
        self._c = handle
        self._mem = _ll.llama_get_memory(handle)
        self.n_batch = int(_ll.llama_n_batch(handle))
        _staging("set_nextn")(handle, True, True)
        self._batch = _ll.llama_batch_ext_init(handle)
        self._closed = False

    def decode(self, tokens: list[int], pos0: int, hidden: np.ndarray,
               want: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """Evaluate ``tokens[i]`` at ``pos0 + i`` with ``hidden[i]`` (the state after the
        position before). Returns (logits, hidden state) of the last token when ``want``."""
        if len(tokens) != len(hidden) or not tokens:
            raise EdgespecError("MTP decode needs one hidden row per token")
        if pos0 < 0 or pos0 + len(tokens) > self.n_ctx:
            raise EdgespecError(f"MTP positions {pos0}..{pos0 + len(tokens) - 1} exceed the "
                                f"context of {self.n_ctx} tokens")
        rows = np.ascontiguousarray(hidden, dtype=np.float32).reshape(len(tokens), self.n_embd)
        for start in range(0, len(tokens), self.n_batch):
            end = min(start + self.n_batch, len(tokens))
            self._run(tokens[start:end], pos0 + start, rows[start:end], want and end == len(tokens))
        if not want:
            return None
        return self._last_output()

    def _run(self, tokens: list[int], pos0: int, rows: np.ndarray, want: bool) -> None:
        b = self._batch
        _ll.llama_batch_ext_clear(b)
        base = rows.ctypes.data
        for i, tok in enumerate(tokens):
            idx = _ll.llama_batch_ext_add_token(b, 0, int(tok))
            if idx < 0:
                raise EdgespecError(f"the MTP batch refused token {tok} (status {idx})")
            pos = (_ll.llama_pos * 1)(pos0 + i)
            row = ctypes.cast(base + i * rows.strides[0], _FloatP)
            ok = _ll.llama_batch_ext_set_pos(b, idx, pos) and _ll.llama_batch_ext_set_embd_token(
                b, idx, _ll.llama_embd(row, 1, self.n_embd))
            if not ok:
                raise EdgespecError(f"the MTP batch refused the hidden row of position {pos0 + i}")
            _ll.llama_batch_ext_set_output_logits(b, idx, bool(want and i == len(tokens) - 1))
        rc = _ll.llama_process(self._c, _ll.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            raise EdgespecError(f"the MTP decode failed with status {rc}: {recent_log(3)}")
        self._last_idx = len(tokens) - 1

    def _last_output(self) -> tuple[np.ndarray, np.ndarray]:
        lp = _ll.llama_get_logits_ith(self._c, self._last_idx)
        hp = _staging("get_nextn_ith")(self._c, self._last_idx)
        if not lp or not hp:
            raise EdgespecError(f"the MTP context returned no output: {recent_log(3)}")
        logits = np.ctypeslib.as_array(lp, shape=(self.n_vocab,)).copy()
        return logits, np.ctypeslib.as_array(hp, shape=(self.n_embd,)).copy()

    def trim(self, from_pos: int) -> None:
        if not _ll.llama_memory_seq_rm(self._mem, 0, from_pos, -1):
            raise EdgespecError(f"could not trim the MTP context from position {from_pos}")

    def clear(self) -> None:
        _ll.llama_memory_clear(self._mem, True)

    def seq_pos_max(self) -> int:
        """The last position the MTP context's KV holds (-1 when empty)."""
        return int(_ll.llama_memory_seq_pos_max(self._mem, 0))

    def close(self) -> None:
        if not self._closed:
            _ll.llama_batch_ext_free(self._batch)
            _ll.llama_free(self._c)
            self._closed = True

