"""The one proposer protocol.

A *proposer* owns engine-lifetime resources (a draft model, a global suffix
tree) and opens one *session* per request; the session owns everything about
that request (token history, draft KV sequence, match state), so several
requests can later run side by side without redesign.

Session verbs, in the order the engine calls them:

* ``propose(k)`` -> :class:`Draft` of at most ``k`` tokens continuing the
  sequence so far (may be empty: "nothing worth drafting").
* ``accept(tokens, n_drafted_accepted)`` after verification: ``tokens`` are
  *all* tokens appended to the sequence this step (the accepted draft prefix
  followed by the target's own token), ``n_drafted_accepted`` how many of them
  came from the last draft. Plain steps call it with ``n_drafted_accepted=0``.
* ``close(completed)`` once, when the request ends.

Proposals never change the output: verification decides. A proposer that
returns ``probs=None`` is treated as a point mass (greedy-style verification,
or for sampling: sample from the target and compare).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..api.params import SamplingParams


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    # (len(tokens), n_vocab) float64/32 distributions the draft sampled from, or None
    probs: np.ndarray | None = None
    # per-token confidence in [0, 1] (draft prob, suffix-tree empirical prob...) or None
    confidence: tuple[float, ...] | None = None
    # proposer-specific detail: which tree, match length, score
    source: str = ""
    match_length: int = 0
    score: float = 0.0

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, k: int) -> "Draft":
        """The first ``k`` tokens, with their distributions and confidences."""
        if len(self) <= k:
            return self
        return replace(self, tokens=self.tokens[:k],
                       probs=self.probs[:k] if self.probs is not None else None,
                       confidence=self.confidence[:k] if self.confidence is not None else None)


EMPTY_DRAFT = Draft(tokens=())


@runtime_checkable
class ProposerSession(Protocol):
    def propose(self, k: int) -> Draft: ...

    def accept(self, tokens: Sequence[int], n_drafted_accepted: int) -> None: ...

    def close(self, completed: bool) -> None: ...


@runtime_checkable
class Proposer(Protocol):
    #: registry name: "draft", "ngram", "suffix", ...
    name: str
    #: True when proposing costs real compute (a draft model); the controller weighs it
    costly: bool

    def open(self, prompt_tokens: Sequence[int], sampling: SamplingParams) -> ProposerSession: ...

    def close(self) -> None:
        """Release engine-lifetime resources."""
        ...


@runtime_checkable
class ReusesPrefix(Protocol):
    """A proposer whose model keeps its KV cache between requests (draft, self, bridge):
    the loop sets ``reuse_prefix`` per request, as the request reuses the target's."""

    reuse_prefix: bool


@runtime_checkable
class Remembers(Protocol):
    """A proposer that learns across requests (the n-gram proposer's dynamic statistics,
    the suffix proposer's global tree). The loop sets ``recall`` per request, before
    ``open``: off, the session drafts from its own request's text alone. A greedy or
    seeded request outside ``--exact`` runs with it off, so what earlier requests (or an
    earlier run's saved state) taught cannot change its passes, nor, through a verify
    pass's batch-dependent logits, its text at a near-tie. It still teaches: a finished
    response is remembered whatever ``recall`` was."""

    recall: bool
