"""Proposer registry: the one place that maps a name to a proposer factory."""
from __future__ import annotations

from typing import Callable

from .base import EMPTY_DRAFT, Draft, Proposer, ProposerSession

__all__ = ["Draft", "EMPTY_DRAFT", "Proposer", "ProposerSession", "FREE_PROPOSERS", "free_proposer"]


def _ngram(**kw) -> Proposer:
    from .ngram import NgramProposer
    return NgramProposer(**kw)


def _suffix(**kw) -> Proposer:
    from .suffix import SuffixProposer
    return SuffixProposer(**kw)


#: proposers that need no model: cheap enough for the engine to load them all
FREE_PROPOSERS: dict[str, Callable[..., Proposer]] = {"ngram": _ngram, "suffix": _suffix}


def free_proposer(name: str, **options) -> Proposer:
    try:
        factory = FREE_PROPOSERS[name]
    except KeyError:
        raise KeyError(f"unknown proposer {name!r}") from None
    return factory(**options)
