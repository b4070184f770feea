"""What a request and a pass own, apart from the loop that runs them, so that the loop
(edgespec.loop.request) and its tree pass (edgespec.loop.treepass) both import them from
below and neither imports the other back.

    Request   everything one request owns (tokens, sessions, controller, KV position, ...)
    Load      the rest of a step other sequences share, as one request plans its part
    Pass      one request's part of a target pass: the pending token and the chosen draft
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..api.events import Control, TokenLogprob
from ..api.labels import MaybeStopReason
from ..api.params import GenerationParams
from ..api.stats import RequestStats
from ..control import Controller
from ..decoding import sampling
from ..decoding.kvcache import PrefixCache
from ..decoding.textstream import TextAssembler
from ..decoding.tree import DraftTree
from ..grammar.state import GrammarState
from ..proposers import Draft, Proposer, ProposerSession


@dataclass
class Request:
    """Everything one request owns."""

    id: int
    params: GenerationParams
    proposer_label: str  # what the request asked for ("none", "suffix", "ngram+suffix", ...)
    tokens: list[int]  # prompt + generated, as the target has them (pending included)
    n_prompt: int
    proposers: dict[str, Proposer] = field(default_factory=dict)  # what to open, by name
    sessions: dict[str, ProposerSession] = field(default_factory=dict)
    costly: frozenset[str] = frozenset()  # sessions that draft only when chosen (draft models)
    controller: Controller | None = None
    max_draft: int = 0  # candidates are proposed at this length
    seq_id: int = 0
    n_past: int = 0  # positions of `tokens` already in the target's KV cache
    reuse: bool = False  # start from the longest prefix of `tokens` the KV cache already holds
    in_flight: bool = False  # a pass has written positions past n_past that are not trimmed yet
    exact: bool = False  # --exact: the plain path's logits, bitwise (docs/parity.md)
    rng: np.random.Generator | None = None  # unused by the loop: draws are keyed (keys)
    #: the request's position-keyed uniforms (sampling's RNG policy), made at its start
    keys: sampling.KeyedUniforms | None = None
    grammar: GrammarState | None = None  # the grammar state of a constrained request
    stats: RequestStats = field(default_factory=RequestStats)
    text: TextAssembler = field(default_factory=TextAssembler)
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    t0: float = 0.0
    stop_reason: MaybeStopReason = ""
    kv: PrefixCache | None = None  # the request's sequence's cache (None: the loop's)
    cancel: threading.Event | None = None  # set to end this request at its next step
    #: llama-cpp-python's logits_processor: (input ids so far, logits row) -> logits, run
    #: before each plain-path choice. A request with one never drafts (Engine.prepare
    #: makes it plain): speculative verification cannot replay an arbitrary callback
    logits_processor: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None

    def uniforms(self) -> sampling.KeyedUniforms:
        """The request's keyed uniforms: its seed's, or a fresh seed's, fixed once."""
        if self.keys is None:
            self.keys = sampling.KeyedUniforms(self.params.sampling.seed)
        return self.keys

    @property
    def prefilled_only(self) -> bool:
        """Whether the prompt may reuse only KV positions a prefill wrote
        (edgespec.decoding.kvcache): a request that promises its text, i.e. exact mode or a
        greedy or seeded one, must compute its first token as a cold prefill would."""
        return self.exact or self.params.sampling.promises_text

    @property
    def generator(self) -> sampling.Cursor:
        """Uniforms for code that draws one per emitted token, in order, from the next
        position on (plain steps, point-mass verification, draft trees): each is the
        position's keyed uniform, so the drafting around it never changes a draw."""
        return self.uniforms().cursor(len(self.generated))

    def close(self) -> None:
        completed = self.stop_reason not in ("", "cancelled")
        for s in self.sessions.values():
            s.close(completed)
        self.sessions.clear()
        if self.grammar is not None:
            self.grammar.close()


@dataclass(frozen=True)
class Load:
    """The rest of a step that several sequences share, as one request plans its part."""

    rows: int  # rows the other sequences already put in this pass
    tokens: float  # tokens they are expected to emit from it
    max_rows: int  # the most rows this request may add (the step's budget)


@dataclass
class Pass:
    """One request's part of a target pass: the pending token and the chosen draft."""

    req: Request
    draft: Draft
    used: str | None  # the proposer that drafted (FORCED for a grammar literal), or None
    draft_seconds: float
    events: list[Control]  # what the controller decided on the way, for the stream
    batch_rows: int = 0  # rows of the whole pass, when other sequences shared it
    expected: float = 1.0  # tokens the controller expects the pass to emit for this request
    declined: bool = False  # a proposer had a draft and the controller took a plain step
    tree: DraftTree | None = None  # a draft tree verified instead of draft (treepass)

    @property
    def tokens(self) -> list[int]:
        return [self.req.tokens[-1], *self.draft.tokens]

    @property
    def logits(self) -> str:
        return "all" if self.draft.tokens else "last"
