"""Request parameters, validated once at the edge (named guards, actionable messages)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import ensure


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target's logits.

    temperature == 0 means greedy (argmax of the processed logits). The same
    processing (penalties, bias, truncation) is applied on the plain and the
    speculative path, so both see the same distribution.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    min_p: float = 0.0  # 0.0 = off
    repeat_penalty: float = 1.0  # 1.0 = off (llama.cpp semantics over the last repeat_last_n tokens)
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def promises_text(self) -> bool:
        """Greedy, or seeded: the same request must give the same text whenever it is sent
        alone (docs/parity.md, "Same request, same text"); unseeded sampling promises none."""
        return self.greedy or self.seed is not None

    @property
    def has_penalties(self) -> bool:
        return (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def validate(self) -> "SamplingParams":
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                     "frequency_penalty"):  # inf and nan pass the range checks below
            ensure(math.isfinite(getattr(self, name)),
                   f"{name} must be a finite number (got {getattr(self, name)})")
        ensure(self.temperature >= 0.0, f"temperature must be >= 0 (got {self.temperature})")
        ensure(self.top_k >= 0, f"top_k must be >= 0, 0 disables it (got {self.top_k})")
        ensure(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1] (got {self.top_p})")
        ensure(0.0 <= self.min_p < 1.0, f"min_p must be in [0, 1) (got {self.min_p})")
        ensure(self.repeat_penalty > 0.0, f"repeat_penalty must be > 0 (got {self.repeat_penalty})")
        ensure(self.repeat_last_n >= 0, f"repeat_last_n must be >= 0 (got {self.repeat_last_n})")
        ensure(self.seed is None or 0 <= self.seed < 2 ** 64,
               f"seed must be between 0 and 2**64 - 1 (got {self.seed})")
        return self


@dataclass(frozen=True)
class GenerationParams:
    """One request: how much to generate, when to stop, how to sample."""

    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    chat: bool = True  # apply the target's own GGUF chat template
    system: str | None = None
    logprobs: int | None = None  # None = off; N = report the top-N alternatives too
    # structured output (at most one): GBNF text, a JSON schema (dict or JSON text), or any
    # JSON object; enforced exactly on every path (edgespec.grammar)
    grammar: str | None = None
    json_schema: str | dict[str, Any] | None = None
    json_mode: bool = False
    # extra chat-template variables: "tools" (OpenAI-shaped declarations) and a request's
    # chat_template_kwargs (edgespec.agents.Turn builds them); read by chat prompts only
    template_vars: Mapping[str, Any] | None = None

    def validate(self) -> "GenerationParams":
        ensure(self.max_tokens >= 1, f"max_tokens must be >= 1 (got {self.max_tokens})")
        ensure(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty")
        self.sampling.validate()
        # the grammar, schema or JSON mode is checked by the parser that will enforce it
        # (edgespec.grammar.constraint.constraint_for): the engine, before a request runs,
        # and the CLI, before any model loads
        return self


