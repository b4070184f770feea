"""Embeddings of an engine's target: inputs (text or token ids) to vectors, over a context of
its own (:class:`edgespec.runtime.embedding.EmbeddingContext`) beside the generation context.

    emb = embedder(engine, pooling="mean")          # opened on first use, closed with the engine
    out = emb.embed(["Hello", [1, 2, 3]], normalize=True)
    out.vectors[0]        # np.ndarray (n_embd,) float32; (n_tokens, n_embd) with pooling "none"
    out.n_tokens          # the tokens read, over every input (what ``usage`` reports)

The server's ``/v1/embeddings`` and ``/api/embed`` and ``edgespec.apps.Llama.embed`` all
come here, so they tokenize, truncate and normalise alike. Generation never waits for an
embedding and an embedding never disturbs the generation context's KV or prefix reuse.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import ContextOverflowError, InvalidInputError
from ..runtime.embedding import EmbeddingContext, pooling_type

if TYPE_CHECKING:
    from ..runtime.model import Model
    from .engine import Engine

#: the embedding context's size at most: pooling evaluates an input in one micro-batch,
#: whose attention buffer grows with the square of its length
MAX_EMBED_CTX = 2048

EmbedInput = str | Sequence[int]


@dataclass(frozen=True)
class Embeddings:
    """One call's vectors, one per input in order, and the tokens read (after truncation)."""

    vectors: tuple[np.ndarray, ...]
    n_tokens: int
    pooling: str  # what was applied: mean, cls, last or none


class Embedder:
    """Tokenize, bound and embed inputs on one :class:`EmbeddingContext` of ``model``."""

    def __init__(self, model: "Model", n_ctx: int, pooling: str = "model",
                 n_threads: int | None = None) -> None:
        self.model = model
        self.context = EmbeddingContext(model, n_ctx, pooling, n_threads)

    @property
    def n_ctx(self) -> int:
        return self.context.n_ctx

    @property
    def n_embd(self) -> int:
        return self.context.n_embd

    @property
    def pooling(self) -> str:
        return self.context.pooling

    def tokens(self, item: EmbedInput, truncate: bool = True, where: str = "input") -> list[int]:
        """An input's tokens: text as llama-cpp-python's ``embed`` tokenizes it (BOS where
        the model adds one, special-token text read as text), token ids as given; longer
        than the context: cut to it (``truncate``) or refused."""
        if isinstance(item, str):
            if not item:
                raise InvalidInputError(f"{where} is empty; embed non-empty text")
            tokens = self.model.tokenize(item, add_special=True, parse_special=False)
        elif isinstance(item, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in item):
            if not item:
                raise InvalidInputError(f"{where} has no tokens")
            bad = [t for t in item if not 0 <= t < self.model.n_vocab]
            if bad:
                raise InvalidInputError(f"{where}: token id {bad[0]} is outside the vocabulary "
                                        f"(0..{self.model.n_vocab - 1})")
            tokens = list(item)
        else:
            raise InvalidInputError(f"{where} must be a string or a list of token ids (got "
                                    f"{type(item).__name__})")
        if len(tokens) > self.n_ctx:
            if not truncate:
                raise ContextOverflowError(
                    f"{where} is {len(tokens)} tokens but embeddings read at most "
                    f"{self.n_ctx}; shorten it (or allow truncation)")
            tokens = tokens[:self.n_ctx]
        return tokens

    def embed(self, inputs: Sequence[EmbedInput], normalize: bool = False,
              truncate: bool = True) -> Embeddings:
        """Every input tokenized and bounded first (a bad one refuses the whole call before
        any is computed), then embedded one by one; ``normalize``: each vector (each token's,
        with pooling none) scaled to unit Euclidean length."""
        if isinstance(inputs, str) or not isinstance(inputs, Sequence):
            raise InvalidInputError("inputs must be a list of strings or token-id lists")
        if not inputs:
            raise InvalidInputError("no input to embed")
        many = len(inputs) > 1
        token_lists = [self.tokens(x, truncate, f"input[{i}]" if many else "input")
                       for i, x in enumerate(inputs)]
        vectors = []
        for tokens in token_lists:
            v = self.context.embed(tokens)
            vectors.append(_normalized(v) if normalize else v)
        return Embeddings(tuple(vectors), sum(len(t) for t in token_lists), self.pooling)

    def close(self) -> None:
        self.context.close()


def _normalized(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    out: np.ndarray = np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)
    return out


# one embedder per (engine, pooling), opened on first use and closed with the engine
_EMBEDDERS: "weakref.WeakKeyDictionary[Engine, dict[str, Embedder]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def embedder(engine: "Engine", pooling: str = "model", n_ctx: int | None = None) -> Embedder:
    """The engine's embedder for ``pooling`` (see :mod:`edgespec.runtime.embedding`), opened
    on first use with a context of ``n_ctx`` tokens (default: the engine's context, at most
    :data:`MAX_EMBED_CTX`); it is freed when the engine closes, before its model is."""
    pooling_type(pooling)  # an unknown name refused before anything is made
    size = n_ctx or min(engine.ctx.n_ctx, MAX_EMBED_CTX)
    with _LOCK:
        per = _EMBEDDERS.setdefault(engine, {})
        key = f"{pooling}/{size}"
        emb = per.get(key)
        if emb is None:
            emb = Embedder(engine.target, size, pooling, engine.ctx.n_threads)
            per[key] = emb
            # the engine's ExitStack releases in reverse order: this context goes before
            # the model it was made from
            engine.on_close(_forget, engine, key)
        return emb


def _forget(engine: "Engine", key: str) -> None:
    with _LOCK:
        emb = _EMBEDDERS.get(engine, {}).pop(key, None)
    if emb is not None:
        emb.close()


__all__ = ["Embedder", "Embeddings", "MAX_EMBED_CTX", "embedder"]
