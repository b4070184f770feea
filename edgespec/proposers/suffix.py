"""Suffix decoding (after SuffixDecoding, Oliaro et al., NeurIPS 2025).

Two native suffix trees speculate on every step and the better score wins:

* a per-request tree over the prompt and the output so far (input-grounded
  text: summaries, RAG answers, code edits repeat their input);
* a global tree over earlier responses of this proposer, shared by its
  requests (agentic and repeated workflows repeat themselves). It has a hard
  byte cap (oldest responses are evicted first) and, with ``cache_path``, is
  saved on ``close()`` and reloaded next time, so a desktop app's repeated
  workflows speed up from one run to the next.

Matches are scored as Arctic Inference scores them. For each length m of the
context's tail found in a tree, the draft follows the most frequent
continuation for at most ``min(max_draft, factor * m + offset)`` tokens (a
budget that grows with the match), multiplying the empirical probabilities
count(child) / count(node) into a path probability, and stops before a token
whose path probability would fall below ``min_token_prob``. A token's
confidence is its path probability (the chance that it and every token before
it are right, as far as the tree has seen); the draft's score is their sum,
the expected number of accepted tokens, and the best score over all m and both
trees wins. The n-gram proposer's scores mean the same, so the engine can
verify the better-scoring of the two each step.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import edgespec._native as _native
from ..errors import InvalidInputError
from ..runtime.native import MAX_DEPTH, MAX_DRAFT, CapacityError, as_tokens
from ..api.params import SamplingParams
from ._native_types import (SuffixCursor, SuffixTree, check_spec_params, draft_from_native,
                            extend_or_drop, speculate_tree)
from .checks import check_int
from .base import EMPTY_DRAFT, Draft
from ..decoding.tree import DraftTree


class SuffixProposer:
    """Knobs: ``factor``/``offset`` (draft length from match length),
    ``min_token_prob``, ``max_draft`` (cap per draft), ``max_depth`` (longest
    suffix the trees index), ``cache_bytes``/``cache_tokens`` (caps of the
    global tree), ``cache_path`` (persist the global tree), ``request_bytes``
    (cap of each per-request tree) and ``use_global`` (off: per-request only)."""

    name = "suffix"
    costly = False

    def __init__(self, factor: float = 1.0, offset: float = 0.0, min_token_prob: float = 0.1,
                 max_draft: int = 16, max_depth: int = 64, cache_bytes: int = 64 << 20,
                 cache_tokens: int | None = None, cache_path: str | os.PathLike[str] | None = None,
                 request_bytes: int = 256 << 20, use_global: bool = True):
        self.max_draft = check_int("suffix max_draft", max_draft, 1, MAX_DRAFT)
        check_spec_params(self.max_draft, factor, offset, min_token_prob)
        self.factor = float(factor)
        self.offset = float(offset)
        self.min_token_prob = float(min_token_prob)
        self.max_depth = check_int("suffix max_depth", max_depth, 2, MAX_DEPTH)
        self.request_bytes = check_int("suffix request_bytes", request_bytes, 64 << 10, 2**62)
        self.cache_tokens = (None if cache_tokens is None else
                             check_int("suffix cache_tokens", cache_tokens, 0, 2**31 - 2))
        self.cache_path = Path(cache_path).expanduser() if cache_path else None
        self._global: SuffixTree | None = None
        self._dirty = False
        self.recall = True  # base.Remembers: the loop sets it per request
        if use_global:
            cache_bytes = check_int("suffix cache_bytes", cache_bytes, 64 << 10, 2**62)
            self._global = SuffixTree(self.max_depth, cache_bytes)
            if self.cache_path is not None and self.cache_path.exists():
                self._global.load(self.cache_path)
                self._trim()

    @property
    def global_tree(self) -> SuffixTree | None:
        return self._global

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "SuffixSession":
        return SuffixSession(self, prompt_tokens)

    def remember(self, response: Sequence[int]) -> None:
        """Adds a finished response to the global tree."""
        if self._global is None or not response:
            return
        try:
            self._global.add(response)
        except CapacityError:
            pass  # larger than the whole cache: the prefix that fit stays
        self._trim()
        self._dirty = True

    def _trim(self) -> None:
        if self.cache_tokens is None:
            return
        tree = self._global
        while tree is not None and tree.num_tokens > self.cache_tokens:
            tree.evict_oldest()

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Writes the global tree's responses to ``path`` (default: cache_path)."""
        target = Path(path) if path is not None else self.cache_path
        if target is None:
            raise InvalidInputError("no suffix cache path: pass one or set cache_path")
        if self._global is not None:
            self._global.save(target)
            self._dirty = False

    def memory_usage(self) -> int:
        """Bytes held by the global tree (sessions report their own)."""
        return self._global.memory_usage() if self._global is not None else 0

    def close(self) -> None:
        if self._global is not None and self.cache_path is not None and self._dirty:
            self.save()
        self._global = None


class SuffixSession:
    __slots__ = ("_p", "_request", "_cursor", "_response", "_closed")

    def __init__(self, proposer: SuffixProposer, prompt_tokens: Sequence[int]):
        self._p = proposer
        prompt = as_tokens(prompt_tokens)
        self._request: SuffixTree | None = SuffixTree(proposer.max_depth, proposer.request_bytes)
        self._request.begin()
        self._cursor: SuffixCursor | None = None
        self._response: list[int] = []
        self._closed = False
        # over its cap the request tree no longer ends where the context does: dropped
        self._request = extend_or_drop(self._request, prompt)
        # recall off (base.Remembers): the global tree is taught (close), not consulted
        if proposer.global_tree is not None and proposer.recall:
            self._cursor = SuffixCursor(proposer.global_tree)
            # the cursor only looks at the last max_depth tokens
            self._cursor.extend(prompt[-proposer.max_depth:])

    def propose(self, k: int) -> Draft:
        p = self._p
        k = min(k, p.max_draft)
        if k <= 0 or self._closed:
            return EMPTY_DRAFT
        # the knobs were validated once, in the proposer: straight to the binding
        return draft_from_native(_native.speculate(
            self._request._t if self._request is not None else None,
            self._cursor._c if self._cursor is not None else None,
            k, p.factor, p.offset, p.min_token_prob))

    def propose_tree(self, k: int, max_children: int = 4) -> DraftTree:
        """The ``k`` most probable continuations as an :class:`edgespec.decoding.tree.DraftTree`
        (the first branch starts as :meth:`propose`'s draft; see ``speculate_tree``)."""
        p = self._p
        k = min(k, p.max_draft)
        if k <= 0 or self._closed:
            return DraftTree((), ())
        return speculate_tree(self._request, self._cursor, k, p.factor, p.offset,
                              p.min_token_prob, max_children)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        if self._closed:
            return
        self._request = extend_or_drop(self._request, tokens)
        if self._cursor is not None:
            self._cursor.extend(tokens)
        self._response.extend(tokens)

    def memory_usage(self) -> int:
        n = self._request.memory_usage() if self._request is not None else 0
        return n + (self._cursor.memory_usage() if self._cursor is not None else 0)

    def close(self, completed: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if completed:
            self._p.remember(self._response)
        self._request = self._cursor = None
        self._response = []
