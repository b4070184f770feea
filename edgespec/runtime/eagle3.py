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
from .head_context import HeadRunner, head_params
from .model import Model
from .staging import FloatP as _FloatP, staging as _staging
from .taps import RowTap

def target_layer_ids(draft: Model) -> tuple[int, ...]:
    """The target layers a loaded EAGLE-3 draft reads (``eagle3.target_layers``)."""
    n = int(_staging("target_layer_ids_n")(draft._m))
    ptr = _staging("target_layer_ids")(draft._m)
    return tuple(int(ptr[i]) for i in range(n)) if n and ptr else ()


class LayerTap(RowTap):
    """The target's features (three layers' inputs, concatenated) by (sequence, position).

    The target context's one decode hook, so it refuses a context another tap already
    feeds. The caller checked the layer ids against the target (``proposers.eagle3.refusal``).
    """

    def __init__(self, ctx: Context, layers: Sequence[int]) -> None:
        if getattr(ctx, "nextn_tap", None) is not None:
            raise EdgespecError("the target context already feeds another proposer's hidden "
                                "states (mtp); run eagle3 on its own")
        self.n_embd = ctx.model.n_embd
        self.layers = tuple(int(x) for x in layers)
        self.n_feat = len(self.layers) * self.n_embd
        super().__init__(ctx)

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

    def _read(self, handle: Any, n: int) -> np.ndarray | None:
        feats = np.empty((n, self.n_feat), dtype=np.float32)
        for k, lid in enumerate(self.layers):
            ptr = self._layer(handle, lid)
            if not ptr:
                raise EdgespecError(f"llama.cpp gave no input rows for target layer {lid}")
            feats[:, k * self.n_embd:(k + 1) * self.n_embd] = \
                np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))
        return feats


class Eagle3Context(HeadRunner):
    """An EAGLE-3 draft's context beside its target's: encode features into ``g`` rows,
    decode (token, g) pairs at positions of sequence 0."""
    kind = "EAGLE-3"
    row_name = "g row"

    def __init__(self, draft: Model, target: Context, n_batch: int = 64, flash_attn: int = 1,
                 type_k: int = 8, type_v: int = 8) -> None:
        self.model, self.n_ctx = draft, target.n_ctx
        self.n_embd, self.n_vocab = draft.n_embd, draft.n_vocab
        self.n_feat = 3 * target.model.n_embd
        # ctx_other: the target's token_embd and output, when the draft has none
        self._open(draft, head_params(target, max(1, min(n_batch, target.n_ctx)), flash_attn,
                                      type_k, type_v))
        self.n_batch = min(int(_ll.llama_n_batch(self._c)), int(_ll.llama_n_ubatch(self._c)))

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
        rows = self._check_span(tokens, g, pos0)
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
        return self._last_output()
