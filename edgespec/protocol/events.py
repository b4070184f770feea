"""What running a :class:`~.request.CoreRequest` yields, per choice ``index``.

Dialects render only these: text as it is settled (:class:`TextDelta`, with the tokens'
origins when asked), the reasoning split off a leading ``<think>`` block
(:class:`ReasoningDelta`), tool calls as they close (:class:`ToolCallDelta`: the id and
name first, then the arguments' JSON text), and one :class:`ChoiceDone` per choice with
the whole answer, its usage, llama-server's ``timings`` and the speculation stats.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ..api.events import TokenLogprob
from ..api.stats import RequestStats


@dataclass(frozen=True)
class TokenPiece:
    """One emitted token's text and where it came from."""

    text: str  # its piece of the text ("" for a token that only starts a character)
    origin: str  # "target", or the proposer that drafted it ("ngram", "suffix", "draft", ...)
    drafted: int = 0  # tokens drafted in the verify pass that emitted it (0: a plain step)
    accepted_at: int | None = None  # its position in that draft; None for the target's own
    position: int = 0  # its position among the tokens its pass emitted


@dataclass(frozen=True)
class TextDelta:
    index: int
    text: str
    tokens: tuple[TokenPiece, ...] = ()  # with CoreRequest.origins only
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    call: int  # the call's index in this choice
    id: str | None  # set on the call's first delta
    name: str | None  # set on the call's first delta
    arguments: str  # a JSON text delta


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object's text


@dataclass(frozen=True)
class ChoiceDone:
    index: int
    finish: str  # "stop" | "length" | "tool_calls" | "cancelled" (| "malformed_tool_call")
    stop_reason: str  # the engine's exact stop reason (eos, stop, grammar, length, context, cancelled)
    text: str  # the whole visible content (reasoning and call markup removed)
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    prompt_tokens: int
    completion_tokens: int
    timings: dict[str, Any]  # llama-server's `timings` object (protocol.timings)
    stats: RequestStats
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_cached: int = 0  # prompt tokens whose KV came from an earlier request
    tokens: tuple[int, ...] = ()  # the completion's token ids
    request: int = 0  # which request of Core.start_all (its choices share one prompt)


CoreEvent = Union[TextDelta, ReasoningDelta, ToolCallDelta, ChoiceDone]

#: the engine's stop reason -> the neutral finish (OpenAI's words; "cancelled" kept apart)
FINISH = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length",
          "context": "length", "cancelled": "cancelled"}
