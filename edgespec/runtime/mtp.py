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

from typing import Any

import numpy as np

from ..errors import EdgespecError
from .backend import ll as _ll
from .context import Context
from .head_context import HeadRunner, head_params
from .model import Model
from .staging import staging as _staging
from .taps import RowTap

def n_layer_nextn(model: Model) -> int:
    """NextN (MTP) blocks the loaded model has (0 for most models)."""
    return int(_ll.llama_model_n_layer_nextn(model._m))


class NextnTap(RowTap):
    """The target's hidden states (``h_nextn``) from its decodes, by (sequence, position):
    llama.cpp publishes one row per batch entry once asked (unmasked)."""

    def __init__(self, ctx: Context) -> None:
        self.n_embd = ctx.model.n_embd
        super().__init__(ctx)

    def _switch(self, on: bool) -> None:
        _staging("set_nextn")(self.ctx._c, on, False)

    def _read(self, handle: Any, n: int) -> np.ndarray | None:
        ptr = _staging("get_nextn")(handle)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()


class MtpContext(HeadRunner):
    """The MTP context of a target loaded with its NextN layers: decode (token, hidden row)
    pairs at positions of sequence 0; get the logits and hidden state of the last one."""
    kind = "MTP"
    row_name = "hidden row"

    def __init__(self, target: Context, n_batch: int = 64, flash_attn: int = 1,
                 type_k: int = 8, type_v: int = 8) -> None:
        model = target.model
        if not getattr(model, "load_mtp", False) or n_layer_nextn(model) <= 0:
            raise EdgespecError(f"{model.path.name} was not loaded with MTP layers")
        self.model, self.n_ctx = model, target.n_ctx
        self.n_embd, self.n_vocab = model.n_embd, model.n_vocab
        params = head_params(target, max(1, min(n_batch, target.n_ctx)), flash_attn,
                             type_k, type_v)
        params.ctx_type = _ll.LLAMA_CONTEXT_TYPE_MTP
        self._open(model, params)
        self.n_batch = int(_ll.llama_n_batch(self._c))

    def decode(self, tokens: list[int], pos0: int, hidden: np.ndarray,
               want: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """Evaluate ``tokens[i]`` at ``pos0 + i`` with ``hidden[i]`` (the state after the
        position before). Returns (logits, hidden state) of the last token when ``want``."""
        rows = self._check_span(tokens, hidden, pos0)
        for start in range(0, len(tokens), self.n_batch):
            end = min(start + self.n_batch, len(tokens))
            self._run(tokens[start:end], pos0 + start, rows[start:end], want and end == len(tokens))
        if not want:
            return None
        return self._last_output()
