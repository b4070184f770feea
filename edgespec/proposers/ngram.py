"""N-gram drafting with confidence (after llama.cpp's ngram-cache).

Each request counts, for every n-gram of orders ``min_n``..``max_n`` of its
prompt and output, which token followed it (the *context* statistics). A draft
takes, token by token, the most frequent continuation of the longest n-gram
whose evidence passes a bar, and stops where none passes: short, confident
drafts instead of the first match, long. The bar at draft position i asks for

* at least ``min_count + i * count_step`` samples behind the n-gram, and
* a share of at least ``min(1, min_share + i * share_step)`` for its best
  continuation,

stricter further out, where a token only counts if every one before it was
right. When the context has nothing that passes, the *dynamic* statistics of
earlier generations (:mod:`.ngram_stats`) are tried with their own, stricter,
bar (``dynamic_count``, ``dynamic_share``). Each token's confidence is its
share; the draft's score is the sum of their running products, the expected
number of accepted tokens (comparable with the suffix proposer's).

``statistics=False`` drafts plain prompt lookup instead (what followed the
latest earlier occurrence of the longest matching tail, no confidence): the
baseline the statistics are measured against.

Both verbs cost microseconds whatever the context length.
"""
from __future__ import annotations

import os
from typing import Sequence

from ..errors import InvalidInputError
from ..runtime.native import MAX_DRAFT, MAX_NGRAM, NGSTAT_MAX_N, as_tokens
from ..api.params import SamplingParams
from ._native_types import (DraftBar, NgramIndex, NgramStats, extend_or_drop, ngram_alternatives,
                            ngram_draft)
from .checks import check_fraction, check_int
from .base import EMPTY_DRAFT, Draft, ProposerSession
from ..decoding.tree import DraftTree
from .ngram_stats import DynamicStats, stats_file

_POSITIONS = 8  # draft positions with a bar of their own (native NGSTAT_POSITIONS)


class NgramProposer:
    """Knobs: ``min_n``/``max_n`` (n-gram orders, longest tried first), ``max_draft``
    (tokens per draft; the controller may ask for fewer), ``max_bytes`` (memory cap
    of each request's statistics), the bar (``min_count``, ``min_share``,
    ``count_step``, ``share_step``; ``dynamic_count``, ``dynamic_share``), the
    dynamic statistics (``use_dynamic``, ``dynamic_bytes``, persisted under
    ``stats_path`` or keyed by ``model_digest``) and ``statistics`` (off: plain
    prompt lookup)."""

    name = "ngram"
    costly = False

    def __init__(self, min_n: int = 2, max_n: int = 6, max_draft: int = 10,
                 max_bytes: int = 64 << 20, min_count: int = 1, min_share: float = 0.5,
                 count_step: int = 0, share_step: float = 0.1, dynamic_count: int = 2,
                 dynamic_share: float = 0.66, use_dynamic: bool = True,
                 dynamic_bytes: int = 32 << 20, stats_path: str | os.PathLike[str] | None = None,
                 model_digest: str | None = None, statistics: bool = True):
        self.statistics = bool(statistics)
        top = NGSTAT_MAX_N if self.statistics else MAX_NGRAM
        self.min_n = check_int("ngram min_n", min_n, 1, top)
        self.max_n = check_int("ngram max_n", max_n, self.min_n, top)
        self.max_draft = check_int("ngram max_draft", max_draft, 1, MAX_DRAFT)
        self.max_bytes = check_int("ngram max_bytes", max_bytes, 64 << 10, 2**62)
        self.dynamic: DynamicStats | None = None
        self.recall = True  # base.Remembers: the loop sets it per request
        if not self.statistics:
            return
        self.bar = _compile_bar(
            min_count=check_int("ngram min_count", min_count, 1, 2**20),
            count_step=check_int("ngram count_step", count_step, 0, 2**20),
            min_share=check_fraction("ngram min_share", min_share),
            share_step=check_fraction("ngram share_step", share_step),
            dynamic_count=check_int("ngram dynamic_count", dynamic_count, 1, 2**20),
            dynamic_share=check_fraction("ngram dynamic_share", dynamic_share))
        if use_dynamic:
            path = stats_path if stats_path is not None else (
                stats_file(model_digest) if model_digest is not None else None)
            self.dynamic = DynamicStats(self.min_n, self.max_n,
                                        check_int("ngram dynamic_bytes", dynamic_bytes, 64 << 10,
                                                  2**62), path)

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> ProposerSession:
        if not self.statistics:
            return LookupSession(self, prompt_tokens)
        return NgramSession(self, prompt_tokens)

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Writes the dynamic statistics (default: their keyed path)."""
        if self.dynamic is None:
            raise InvalidInputError("the ngram proposer keeps no dynamic statistics "
                                    "(statistics=False or use_dynamic=False)")
        self.dynamic.save(path)

    def memory_usage(self) -> int:
        """Bytes held by the dynamic statistics (sessions report their own)."""
        return self.dynamic.table.memory_usage() if self.dynamic is not None else 0

    def close(self) -> None:
        if self.dynamic is not None:
            self.dynamic.close()
            self.dynamic = None


def _compile_bar(min_count: int, count_step: int, min_share: float, share_step: float,
                 dynamic_count: int, dynamic_share: float) -> DraftBar:
    counts = [min_count + i * count_step for i in range(_POSITIONS)]
    shares = [min(1.0, min_share + i * share_step) for i in range(_POSITIONS)]
    return DraftBar(order_extra=[0], context_counts=counts, context_shares=shares,
                    dynamic_counts=[max(c, dynamic_count + i * count_step)
                                    for i, c in enumerate(counts)],
                    dynamic_shares=[max(s, min(1.0, dynamic_share + i * share_step))
                                    for i, s in enumerate(shares)])


class NgramSession:
    """One request: its context statistics, drafting with the proposer's dynamic ones."""

    __slots__ = ("_p", "_context", "_dynamic", "_prompt", "_output", "_closed")

    def __init__(self, proposer: NgramProposer, prompt_tokens: Sequence[int]):
        self._p = proposer
        self._context: NgramStats | None = NgramStats(proposer.min_n, proposer.max_n,
                                                      proposer.max_bytes)
        # recall off (base.Remembers): the dynamic statistics are taught, not consulted
        self._dynamic = (proposer.dynamic.table if proposer.dynamic is not None
                         and proposer.recall else None)
        self._prompt = as_tokens(prompt_tokens)
        self._output: list[int] = []
        self._closed = False
        # over its byte cap the table decays; only a refusing allocator drops it
        self._context = extend_or_drop(self._context, self._prompt)

    def propose(self, k: int) -> Draft:
        k = min(k, self._p.max_draft)
        if k <= 0 or self._closed or self._context is None:
            return EMPTY_DRAFT
        return ngram_draft(self._context, self._dynamic, k, self._p.bar)

    def propose_tree(self, k: int, max_children: int = 4) -> DraftTree:
        """The linear draft as the first branch, the statistics' other continuations of the
        next position as the rest (see ``ngram_alternatives``): an
        :class:`edgespec.decoding.tree.DraftTree` with path probabilities as confidence."""
        lin = self.propose(k)
        if self._closed or self._context is None or k <= 0:
            return DraftTree((), ())
        k = min(k, self._p.max_draft)
        paths: list[Sequence[int]] = []
        confs: list[Sequence[float]] = []
        if lin.tokens:
            run, path_p = 1.0, []
            for c in lin.confidence or (0.0,) * len(lin):
                run *= c
                path_p.append(run)
            paths.append(lin.tokens)
            confs.append(tuple(path_p))
        history = [*self._prompt[-self._p.max_n:], *self._output][-self._p.max_n:]
        for toks, probs in ngram_alternatives(self._context, history, max_children,
                                              depth=max(1, k // max(1, max_children))):
            if not lin.tokens or toks[0] != lin.tokens[0]:
                paths.append(toks)
                confs.append(probs)
        return DraftTree.from_paths(paths, confs, source=lin.source or "context", max_nodes=k)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        if self._closed:
            return
        self._context = extend_or_drop(self._context, tokens)
        self._output.extend(tokens)

    def memory_usage(self) -> int:
        return self._context.memory_usage() if self._context is not None else 0

    def close(self, completed: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if completed and self._p.dynamic is not None:
            self._p.dynamic.remember(self._prompt, self._output)
        self._context = None
        self._output = []


class LookupSession:
    """Plain prompt lookup (``statistics=False``): the latest earlier match, no confidence."""

    __slots__ = ("_index", "_max_draft")

    def __init__(self, proposer: NgramProposer, prompt_tokens: Sequence[int]):
        self._index: NgramIndex | None = NgramIndex(proposer.min_n, proposer.max_n,
                                                    proposer.max_bytes)
        self._max_draft = proposer.max_draft
        self._index = extend_or_drop(self._index, prompt_tokens)

    def propose(self, k: int) -> Draft:
        if self._index is None or k <= 0:
            return EMPTY_DRAFT
        return self._index.propose(min(k, self._max_draft))

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        self._index = extend_or_drop(self._index, tokens)

    def close(self, completed: bool) -> None:
        self._index = None
