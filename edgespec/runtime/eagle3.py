"""llama.cpp's EAGLE-3 draft (arch ``eagle3``): a one-layer head fed by the target's features.

An EAGLE-3 GGUF carries a feature-fusion matrix ``fc`` (three target layers' hidden states
concatenated, ``3 * n_embd_tgt``, projected to the draft's ``n_embd``) and one decoder
layer. llama.cpp runs it in a context of its own whose ``ctx_other`` is the target's (the
draft borrows the target's ``token_embd`` and ``output`` when it has none):

* the encoder (``llama_process(ENCODE)``, per token, no KV) turns the features of position
  ``P`` into ``g_P``;
* the decoder at draft-KV position ``P`` takes the pair ``(t_{P+1}, g_P)`` (RoPE at ``P``)
  and gives logits for ``t_{P+2}`` plus a pre-norm state, the ``g`` of the next draft step.

The target's features are a by-product of its verify pass: :class:`LayerTap` turns on
``llama_set_embeddings_layer_inp`` for the three layers (``llama_set_embeddings_nextn``
for a layer id equal to the target's layer count) and copies the rows out after every
decode, keyed by sequence and position. Only some target architectures publish their
layer inputs; for the others llama.cpp aborts the process, so the proposer refuses them
before anything here runs (``edgespec.proposers.eagle3.LAYER_INPUT_ARCHS``).
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np

from ..errors import EdgespecError
from .backend import ll as _ll, recent_log
from .context import Context
from .model import Model
from .staging import FloatP as _FloatP, staging as _staging

def target_layer_ids(draft: Model) -> tuple[int, ...]:
    """The target layers a loaded EAGLE-3 draft reads (``eagle3.target_layers``)."""
    n = int(_staging("target_layer_ids_n")(draft._m))
    ptr = _staging("target_layer_ids")(draft._m)
    return tuple(int(ptr[i]) for i in range(n)) if n and ptr else ()


class LayerTap:
    """The target's features (three layers' inputs, concatenated) by (sequence, position).

    Attached to a target :class:`Context` (``ctx.nextn_tap``, its one decode hook), called
    after every ``llama_decode`` of that context with the batch just evaluated. A decode at
    positions ``a..b`` of a sequence makes every row past ``b`` stale, so those are dropped.
    The caller checked the layer ids against the target (``proposers.eagle3.refusal``).
    """

    def __init__(self, ctx: Context, layers: Sequence[int]) -> None:
        if getattr(ctx, "nextn_tap", None) is not None:
            raise EdgespecError("the target context already feeds another proposer's hidden "
                                "states (mtp); run eagle3 on its own")
        self.ctx = ctx
        self.n_embd = ctx.model.n_embd
        self.layers = tuple(int(x) for x in layers)
        self.n_feat = len(self.layers) * self.n_embd
        self.rows: dict[int, dict[int, np.ndarray]] = {}
        self._switch(True)
        ctx.nextn_tap = self

    def _switch(self, on: bool) -> None:
        n_layer = self.ctx.model.n_layer
        for lid in self.layers:
            if lid < n_layer:
                _staging("set_layer_inp")(self.ctx._c, lid, on)
            else:
                _staging("set_nextn")(self.ctx._c, on, False)

    def _layer(self, handle: Any, lid: int) -> Any:
        if lid < self.ctx.model.n_layer:
            return _staging("get_layer_inp")(handle, lid)
        return _staging("get_nextn")(handle)

    def __call__(self, handle: Any, batch: Any, n: int) -> None:
        if n <= 0:
            return
        feats = np.empty((n, self.n_feat), dtype=np.float32)
        for k, lid in enumerate(self.layers):
            ptr = self._layer(handle, lid)
            if not ptr:
                raise EdgespecError(f"llama.cpp gave no input rows for target layer {lid}")
            feats[:, k * self.n_embd:(k + 1) * self.n_embd] = \
                np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))
        last: dict[int, int] = {}
        for i in range(n):
            seq, pos = int(batch.seq_id[i][0]), int(batch.pos[i])
            self.rows.setdefault(seq, {})[pos] = feats[i]
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
                self._switch(False)
        self.rows.clear()


def _params(target: Context, n_batch: int, flash_attn: int, type_k: int, type_v: int) -> Any:
    p = _ll.llama_context_default_params()
    p.n_ctx = target.n_ctx
    p.n_batch = n_batch
    p.n_ubatch = n_batch  # the encoder takes at most one ubatch per call
    p.n_seq_max = 1
    p.n_threads = target.n_threads
    p.n_threads_batch = target.n_threads
    p.flash_attn_type = flash_attn
    p.no_perf = True
    p.type_k = type_k
    p.type_v = type_v
    p.ctx_other = target._c  # the target's token_embd and output, when the draft has none
    return p


class Eagle3Context:
    """An EAGLE-3 draft's context beside its target's: encode features into ``g`` rows,
    decode (token, g) pairs at positions of sequence 0."""

    def __init__(self, draft: Model, target: Context, n_batch: int = 64, flash_attn: int = 1,
                 type_k: int = 8, type_v: int = 8) -> None:
        self.model, self.n_ctx = draft, target.n_ctx
        self.n_embd, self.n_vocab = draft.n_embd, draft.n_vocab
        self.n_feat = 3 * target.model.n_embd
        params = _params(target, max(1, min(n_batch, target.n_ctx)), flash_attn, type_k, type_v)
        handle = _ll.llama_init_from_model(draft._m, params)
        if not handle:
            raise EdgespecError(f"llama.cpp could not create the EAGLE-3 context of "
                                f"{draft.path.name}: {recent_log(4)}")
        self._c = handle
        self._mem = _ll.llama_get_memory(handle)
        self.n_batch = min(int(_ll.llama_n_batch(handle)), int(_ll.llama_n_ubatch(handle)))
        _staging("set_nextn")(handle, True, True)
        self._batch = _ll.llama_batch_ext_init(handle)
        self._closed = False

    def encode(self, features: np.ndarray) -> np.ndarray:
        """The ``g`` row of each feature row (``[n, 3 * n_embd_tgt]`` -> ``[n, n_embd]``)."""
        feats = np.ascontiguousarray(features, dtype=np.float32).reshape(-1, self.n_feat)
        out = np.empty((len(feats), self.n_embd), dtype=np.float32)
        b = self._batch
        for start in range(0, len(feats), self.n_batch):
            chunk = feats[start:start + self.n_batch]
            _ll.llama_batch_ext_clear(b)
            pos = self.seq_pos_max() + 1  # placeholders: the encoder reads no position
            for i in range(len(chunk)):
                row = ctypes.cast(chunk.ctypes.data + i * chunk.strides[0], _FloatP)
                idx = _ll.llama_batch_ext_add_embd(b, 0, _ll.llama_embd(row, 1, self.n_feat))
                p = (_ll.llama_pos * 1)(pos + i)
                if idx < 0 or not _ll.llama_batch_ext_set_pos(b, idx, p):
                    raise EdgespecError(f"the EAGLE-3 encoder batch refused row {i} (status {idx})")
                _ll.llama_batch_ext_set_output_logits(b, idx, True)
            rc = _ll.llama_process(self._c, _ll.LLAMA_PROCESS_TYPE_ENCODE, b)
            ptr = _staging("get_nextn")(self._c) if rc == 0 else None
            if not ptr:
                raise EdgespecError(f"the EAGLE-3 encoder failed (status {rc}): {recent_log(3)}")
            out[start:start + len(chunk)] = np.ctypeslib.as_array(ptr, shape=(len(chunk), self.n_embd))
        return out

    def decode(self, tokens: list[int], pos0: int, g: np.ndarray,
               want: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """Evaluate ``(tokens[i], g[i])`` at ``pos0 + i``. Returns (logits, pre-norm state)
        of the last pair when ``want``."""
        if len(tokens) != len(g) or not tokens:
            raise EdgespecError("EAGLE-3 decode needs one g row per token")
        if pos0 < 0 or pos0 + len(tokens) > self.n_ctx:
            raise EdgespecError(f"EAGLE-3 positions {pos0}..{pos0 + len(tokens) - 1} exceed "
                                f"the context of {self.n_ctx} tokens")
        rows = np.ascontiguousarray(g, dtype=np.float32).reshape(len(tokens), self.n_embd)
        # the eagle3 graph computes every row's output but llama.cpp copies out the first
        # n_outputs rows (it selects no output ids): the pair whose output is wanted runs
        # alone, as llama.cpp's own driver does
        n_in = len(tokens) - 1 if want else len(tokens)
        for start in range(0, n_in, self.n_batch):
            end = min(start + self.n_batch, n_in)
            self._run(tokens[start:end], pos0 + start, rows[start:end], False)
        if not want:
            return None
        self._run(tokens[-1:], pos0 + n_in, rows[n_in:], True)
        lp = _ll.llama_get_logits_ith(self._c, self._last_idx)
        hp = _staging("get_nextn_ith")(self._c, self._last_idx)
        if not lp or not hp:
            raise EdgespecError(f"the EAGLE-3 context returned no output: {recent_log(3)}")
        return (np.ctypeslib.as_array(lp, shape=(self.n_vocab,)).copy(),
                np.ctypeslib.as_array(hp, shape=(self.n_embd,)).copy())

    def _run(self, tokens: list[int], pos0: int, rows: np.ndarray, want: bool) -> None:
        b = self._batch
        _ll.llama_batch_ext_clear(b)
        for i, tok in enumerate(tokens):
            idx = _ll.llama_batch_ext_add_token(b, 0, int(tok))
            if idx < 0:
                raise EdgespecError(f"the EAGLE-3 batch refused token {tok} (status {idx})")
            pos = (_ll.llama_pos * 1)(pos0 + i)
            row = ctypes.cast(rows.ctypes.data + i * rows.strides[0], _FloatP)
            ok = _ll.llama_batch_ext_set_pos(b, idx, pos) and _ll.llama_batch_ext_set_embd_token(
                b, idx, _ll.llama_embd(row, 1, self.n_embd))
            if not ok:
                raise EdgespecError(f"the EAGLE-3 batch refused the g row of position {pos0 + i}")
            _ll.llama_batch_ext_set_output_logits(b, idx, bool(want and i == len(tokens) - 1))
        rc = _ll.llama_process(self._c, _ll.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            raise EdgespecError(f"the EAGLE-3 decode failed with status {rc}: {recent_log(3)}")
        self._last_idx = len(tokens) - 1

    def trim(self, from_pos: int) -> None:
        if not _ll.llama_memory_seq_rm(self._mem, 0, from_pos, -1):
            raise EdgespecError(f"could not trim the EAGLE-3 context from position {from_pos}")

    def clear(self) -> None:
        _ll.llama_memory_clear(self._mem, True)

    def seq_pos_max(self) -> int:
        """The last position the draft's KV holds (-1 when empty)."""
        return int(_ll.llama_memory_seq_pos_max(self._mem, 0))

    def close(self) -> None:
        if not self._closed:
            _ll.llama_batch_ext_free(self._batch)
            _ll.llama_free(self._c)
            self._closed = True
