"""Prompt lookup: draft what followed the latest earlier occurrence of the context's tail.

Each request gets its own native n-gram index over prompt + output; ``propose``
and ``accept`` cost a few microseconds whatever the context length. Drafts are
point masses (no probabilities); ``match_length`` is the matched n-gram order.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import InvalidInputError
from ..native import MAX_DRAFT, MAX_NGRAM, CapacityError, NgramIndex, _check_int, as_tokens
from ..params import SamplingParams
from .base import EMPTY_DRAFT, Draft


class NgramProposer:
    """Knobs: ``min_n``/``max_n`` (n-gram orders tried, longest first),
    ``max_draft`` (tokens per draft; the controller may ask for fewer) and
    ``max_bytes`` (hard memory cap per request)."""

    name = "ngram"
    costly = False

    def __init__(self, min_n: int = 2, max_n: int = 5, max_draft: int = 10,
                 max_bytes: int = 256 << 20):
        self.min_n = _check_int("ngram min_n", min_n, 1, MAX_NGRAM)
        self.max_n = _check_int("ngram max_n", max_n, self.min_n, MAX_NGRAM)
        self.max_draft = _check_int("ngram max_draft", max_draft, 1, MAX_DRAFT)
        self.max_bytes = _check_int("ngram max_bytes", max_bytes, 64 << 10, 2**62)

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> "NgramSession":
        return NgramSession(self, prompt_tokens)

    def close(self) -> None:
        """Nothing outlives a request: each session owns its index."""


class NgramSession:
    __slots__ = ("_index", "_raw", "_max_draft")

    def __init__(self, proposer: NgramProposer, prompt_tokens: Sequence[int]):
        self._index = NgramIndex(proposer.min_n, proposer.max_n, proposer.max_bytes)
        self._max_draft = proposer.max_draft
        self._raw = self._index._ix  # the per-step verbs skip the wrapper's re-validation
        self._extend(prompt_tokens, validate=True)

    def _extend(self, tokens, validate: bool = False) -> None:
        if self._raw is None:
            return
        try:
            self._raw.extend(as_tokens(tokens) if validate else tokens)
        except CapacityError:
            # over its cap the index no longer covers the context: stop drafting
            self._raw = None
        except (TypeError, ValueError) as e:
            raise InvalidInputError(str(e)) from None

    def propose(self, k: int) -> Draft:
        if self._raw is None or k <= 0:
            return EMPTY_DRAFT
        toks, n = self._raw.propose(min(k, self._max_draft))
        if not toks:
            return EMPTY_DRAFT
        return Draft(tokens=toks, source="ngram", match_length=n)

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None:
        self._extend(tokens)

    def close(self, completed: bool) -> None:
        self._raw = None
        self._index = None
