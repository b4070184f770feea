"""Embeddings from a loaded model, through a context of its own.

An :class:`EmbeddingContext` is a second llama.cpp context on an already loaded
:class:`~edgespec.runtime.model.Model` (the weights are shared, not loaded again), created
with ``embeddings = true`` and a pooling type. The generation context, its KV cache and
its prefix reuse are never touched, so a server can answer ``/v1/embeddings`` between
generation steps of the same model.

Pooling, as llama.cpp's ``enum llama_pooling_type`` names it:

- ``mean``: the average of every token's hidden state (what llama-server's
  ``--pooling mean`` gives; the usual choice for a generative model);
- ``cls``: the first token's (BERT-style encoders);
- ``last``: the last token's (decoder embedding models such as Qwen3-Embedding);
- ``none``: no pooling, one vector per token;
- ``model``: the pooling the GGUF declares (``{arch}.pooling_type``: an embedding model's
  own), mean where it declares none (a generative model).

Each input is decoded alone, in one micro-batch (pooling needs every token of a sequence
in the same ubatch), with every token marked as an output as llama.cpp wants in embedding
mode; the memory is cleared before each input so inputs never attend to each other.
"""
from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import ContextOverflowError, EdgespecError, InvalidInputError
from .backend import default_threads, ll as _ll, recent_log

if TYPE_CHECKING:
    from .model import Model

#: pooling name -> llama.cpp's enum llama_pooling_type (RANK, a reranker's head, is not an
#: embedding and is not offered)
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3}
#: LLAMA_POOLING_TYPE_UNSPECIFIED: the model's own pooling
POOLING_MODEL = -1
POOLING_NAMES = ("mean", "cls", "last", "none", "model")


def pooling_type(name: str) -> int:
    """llama.cpp's pooling enum for a name of :data:`POOLING_NAMES` (unknown: refused)."""
    if name == "model":
        return POOLING_MODEL
    if name not in POOLING:
        raise InvalidInputError(f"pooling {name!r} is not one of {', '.join(POOLING_NAMES)}")
    return POOLING[name]


class EmbeddingContext:
    """A context of ``model`` in embedding mode; :meth:`embed` one token list at a time.

    Not thread-safe by itself beyond one call at a time (a lock serialises calls); the
    model it shares is only read.
    """

    def __init__(self, model: "Model", n_ctx: int, pooling: str = "mean",
                 n_threads: int | None = None) -> None:
        if n_ctx <= 0:
            raise EdgespecError(f"an embedding context needs a positive size (got {n_ctx})")
        self.model = model
        wanted = pooling_type(pooling)
        if wanted == POOLING_MODEL:
            wanted = declared_pooling(model)
        threads = n_threads or default_threads()
        p = _ll.llama_context_default_params()
        p.n_ctx = n_ctx
        # the whole input in one micro-batch: llama.cpp pools within a ubatch
        p.n_batch = n_ctx
        p.n_ubatch = n_ctx
        p.n_seq_max = 1
        p.n_threads = threads
        p.n_threads_batch = threads
        p.embeddings = True
        p.pooling_type = wanted
        p.no_perf = True
        handle = _ll.llama_init_from_model(model._m, p)
        if not handle:
            raise EdgespecError(f"llama.cpp could not create an embedding context of {n_ctx} "
                                f"tokens for {model.path.name}: {recent_log(4)}")
        self._c = handle
        self.n_ctx = min(n_ctx, int(_ll.llama_n_ctx(handle)), int(_ll.llama_n_ubatch(handle)))
        #: the pooling llama.cpp applies (the model's own when "model" was asked)
        kind = int(_ll.llama_pooling_type(handle))
        if kind not in POOLING.values():
            # a reranker's RANK head, or a model that declares nothing llama.cpp pools with
            _ll.llama_free(handle)
            raise EdgespecError(f"{model.path.name} declares pooling type {kind}, which is not "
                                "an embedding; ask for pooling mean, cls, last or none")
        self.pooling = next(k for k, v in POOLING.items() if v == kind)
        self.n_embd = int(_ll.llama_model_n_embd_out(model._m)) or model.n_embd
        self._mem = _ll.llama_get_memory(handle)
        self._batch = _ll.llama_batch_init(self.n_ctx, 0, 1)
        self._lock = threading.Lock()
        self._closed = False

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """The embedding of one token list: shape (n_embd,), or (len(tokens), n_embd) with
        pooling ``none``. Raw (not normalised); float32."""
        n = len(tokens)
        if n == 0:
            raise InvalidInputError("cannot embed an empty input (it tokenized to nothing)")
        if n > self.n_ctx:
            raise ContextOverflowError(f"the input is {n} tokens but the embedding context "
                                       f"holds {self.n_ctx}; shorten it or truncate")
        nv = self.model.n_vocab
        with self._lock:
            if self._closed:
                raise EdgespecError("the embedding context is closed")
            b = self._batch
            for i, t in enumerate(tokens):
                if not 0 <= int(t) < nv:
                    raise InvalidInputError(f"token id {t} is outside the vocabulary "
                                            f"(0..{nv - 1})")
                b.token[i] = int(t)
                b.pos[i] = i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1  # every token an output: llama.cpp pools over outputs
            b.n_tokens = n
            _ll.llama_memory_clear(self._mem, True)
            rc = _ll.llama_decode(self._c, b)
            if rc != 0:
                raise EdgespecError(f"llama_decode (embedding) failed with status {rc}: "
                                    f"{recent_log(3)}")
            if self.pooling == "none":
                ptr = _ll.llama_get_embeddings(self._c)
                if not ptr:
                    raise EdgespecError("llama.cpp returned no token embeddings")
                return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()
            ptr = _ll.llama_get_embeddings_seq(self._c, 0)
            if not ptr:
                raise EdgespecError("llama.cpp returned no pooled embedding")
            return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                _ll.llama_batch_free(self._batch)
                _ll.llama_free(self._c)
                self._closed = True

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def declared_pooling(model: "Model") -> int:
    """The pooling the GGUF declares (``{arch}.pooling_type``), mean when it declares none
    or no pooling (a generative model: its per-token states averaged)."""
    arch = model.meta("general.architecture")
    value = model.meta(f"{arch}.pooling_type") if arch else None
    try:
        kind = int(value) if value is not None else 0
    except ValueError:
        kind = 0
    return kind if kind in (1, 2, 3) else POOLING["mean"]


def model_kind(model: "Model") -> tuple[bool, bool]:
    """(recurrent, hybrid): what ``llama_cpp.Llama`` keeps as ``_is_recurrent`` and
    ``_is_hybrid`` (a recurrent state cannot be trimmed to a prefix)."""
    return (bool(_ll.llama_model_is_recurrent(model._m)),
            bool(_ll.llama_model_is_hybrid(model._m)))


def model_metadata(model: "Model") -> dict[str, str]:
    """The GGUF's key/value metadata as llama.cpp reports it (``llama_model_meta_*``): every
    value as its string, what ``llama_cpp.Llama.metadata`` holds."""
    out: dict[str, str] = {}
    size = 1024
    buf = ctypes.create_string_buffer(size)
    for i in range(int(_ll.llama_model_meta_count(model._m))):
        pair = []
        for read in (_ll.llama_model_meta_key_by_index, _ll.llama_model_meta_val_str_by_index):
            n = int(read(model._m, i, buf, size))
            if n >= size:
                size = n + 1
                buf = ctypes.create_string_buffer(size)
                n = int(read(model._m, i, buf, size))
            pair.append(buf.value.decode("utf-8", "replace") if n >= 0 else "")
        out[pair[0]] = pair[1]
    return out


__all__ = ["EmbeddingContext", "POOLING", "POOLING_NAMES", "declared_pooling", "model_kind",
           "model_metadata",
           "pooling_type"]
