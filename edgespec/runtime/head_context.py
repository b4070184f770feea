"""A head's own llama.cpp context beside its target's (``MtpContext``, ``Eagle3Context``).

Both drafting heads fed by the target's verify pass run in a context of their own whose
``ctx_other`` is the target's, decode (token, row) pairs at positions of sequence 0 through
a ``llama_batch_ext``, read back the last pair's logits and pre-norm state
(``llama_set_embeddings_nextn``), and trim their cache after every draft. That plumbing is
one piece here, so a fix to it reaches both; a kind says only how its context is made and
what its rows are (:mod:`.mtp`, :mod:`.eagle3`).
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


def head_params(target: Context, n_batch: int, flash_attn: int, type_k: int,
                type_v: int) -> Any:
    """Context parameters for a head beside ``target``: its context length and threads,
    one sequence, ``ctx_other`` the target's (whose weights or embeddings the head reads)."""
    p = _ll.llama_context_default_params()
    p.n_ctx = target.n_ctx
    p.n_batch = n_batch
    p.n_ubatch = n_batch  # an EAGLE-3 encoder takes at most one ubatch per call
    p.n_seq_max = 1
    p.n_threads = target.n_threads
    p.n_threads_batch = target.n_threads
    p.flash_attn_type = flash_attn
    p.no_perf = True
    p.type_k = type_k
    p.type_v = type_v
    p.ctx_other = target._c
    return p


class HeadRunner:
    """The llama.cpp side of a head: its context, KV memory and batch; decode (token, row)
    pairs; trim, clear, close. ``kind`` and ``row_name`` name it in errors."""
    kind = "head"
    row_name = "row"
    n_ctx: int
    n_embd: int
    n_vocab: int

    def _open(self, model: Model, params: Any) -> None:
        """Create the context from ``model`` (raises with llama.cpp's log when it cannot)
        and turn on its pre-norm state, which feeds the next draft step."""
        handle = _ll.llama_init_from_model(model._m, params)
        if not handle:
            raise EdgespecError(f"llama.cpp could not create the {self.kind} context of "
                                f"{model.path.name}: {recent_log(4)}")
        self._c = handle
        self._mem = _ll.llama_get_memory(handle)
        _staging("set_nextn")(handle, True, True)
        self._batch = _ll.llama_batch_ext_init(handle)
        self._closed = False

    def _check_span(self, tokens: list[int], rows: np.ndarray, pos0: int) -> np.ndarray:
        """``rows`` as one contiguous float32 row per token, after checking the positions
        fit the context (llama.cpp would fail later, with less to say)."""
        if len(tokens) != len(rows) or not tokens:
            raise EdgespecError(f"{self.kind} decode needs one {self.row_name} per token")
        if pos0 < 0 or pos0 + len(tokens) > self.n_ctx:
            raise EdgespecError(f"{self.kind} positions {pos0}..{pos0 + len(tokens) - 1} "
                                f"exceed the context of {self.n_ctx} tokens")
        return np.ascontiguousarray(rows, dtype=np.float32).reshape(len(tokens), self.n_embd)

    def _run(self, tokens: list[int], pos0: int, rows: np.ndarray, want: bool) -> None:
        b = self._batch
        _ll.llama_batch_ext_clear(b)
        for i, tok in enumerate(tokens):
            idx = _ll.llama_batch_ext_add_token(b, 0, int(tok))
            if idx < 0:
                raise EdgespecError(f"the {self.kind} batch refused token {tok} (status {idx})")
            pos = (_ll.llama_pos * 1)(pos0 + i)
            row = ctypes.cast(rows.ctypes.data + i * rows.strides[0], _FloatP)
            ok = _ll.llama_batch_ext_set_pos(b, idx, pos) and _ll.llama_batch_ext_set_embd_token(
                b, idx, _ll.llama_embd(row, 1, self.n_embd))
            if not ok:
                raise EdgespecError(f"the {self.kind} batch refused the {self.row_name} of "
                                    f"position {pos0 + i}")
            _ll.llama_batch_ext_set_output_logits(b, idx, bool(want and i == len(tokens) - 1))
        rc = _ll.llama_process(self._c, _ll.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            raise EdgespecError(f"the {self.kind} decode failed with status {rc}: {recent_log(3)}")
        self._last_idx = len(tokens) - 1

    def _last_output(self) -> tuple[np.ndarray, np.ndarray]:
        lp = _ll.llama_get_logits_ith(self._c, self._last_idx)
        hp = _staging("get_nextn_ith")(self._c, self._last_idx)
        if not lp or not hp:
            raise EdgespecError(f"the {self.kind} context returned no output: {recent_log(3)}")
        logits = np.ctypeslib.as_array(lp, shape=(self.n_vocab,)).copy()
        return logits, np.ctypeslib.as_array(hp, shape=(self.n_embd,)).copy()

    def trim(self, from_pos: int) -> None:
        if not _ll.llama_memory_seq_rm(self._mem, 0, from_pos, -1):
            raise EdgespecError(f"could not trim the {self.kind} context from position {from_pos}")

    def clear(self) -> None:
        _ll.llama_memory_clear(self._mem, True)

    def seq_pos_max(self) -> int:
        """The last position the head's KV holds (-1 when empty)."""
        return int(_ll.llama_memory_seq_pos_max(self._mem, 0))

    def close(self) -> None:
        if not self._closed:
            _ll.llama_batch_ext_free(self._batch)
            _ll.llama_free(self._c)
            self._closed = True
