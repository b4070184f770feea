"""The neutral request every dialect parses its wire format into.

A dialect (OpenAI chat or completions, Anthropic Messages, Responses, Ollama, llama.cpp's
native endpoints) turns its body into one :class:`CoreRequest`; :class:`~.core.Core` runs
it. Exactly one of ``messages`` (a chat turn through the model's template), ``prompt``
(text or token ids, no template) and ``fim`` (fill-in-the-middle with the model's FIM
tokens) says what the model reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..api.params import GenerationParams
from .errors import bad_request


@dataclass(frozen=True)
class Fim:
    """Fill-in-the-middle: the model writes what goes between ``prefix`` and ``suffix``
    (llama.cpp's ``/infill``, OpenAI's and Ollama's ``suffix``)."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()  # (filename, text) context files (input_extra)


@dataclass(frozen=True)
class CoreRequest:
    model: str | None  # None or "": the server's default model
    params: GenerationParams  # max_tokens, stop, sampling, logprobs, grammar, chat
    # OpenAI-shaped chat messages: {"role", "content": str | None, "tool_calls": [...],
    # "tool_call_id": str, "name": str}
    messages: tuple[dict[str, Any], ...] | None = None
    prompt: str | tuple[int, ...] | None = None  # raw prompt: text or token ids
    fim: Fim | None = None
    # OpenAI function tools: {"type": "function", "function": {name, description, parameters}}
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None  # "auto" | "none" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool | None = None
    reasoning_format: str | None = None  # as edgespec.agents (None: the server's default)
    chat_template_kwargs: dict[str, Any] | None = None
    n: int = 1  # parallel choices sharing the prompt's KV
    echo: bool = False  # completions: the prompt's text starts the answer
    origins: bool = False  # per-token origins on every TextDelta (the web page's extension)
    proposer: str | None = None  # a loaded proposer for this request (None: the engine's)
    param_prompt: str = "messages"  # the dialect's name for the prompt field (errors name it)
    #: llama-cpp-python's logits_processor, (input_ids, logits) -> logits: such a request
    #: runs on the plain path (no drafts). Honoured by :func:`~.core.run` (edgespec.apps);
    #: no server dialect sets it
    logits_processor: Callable[[Any, Any], Any] | None = field(default=None, compare=False,
                                                               repr=False)

    def __post_init__(self) -> None:
        given = [f for f in ("messages", "prompt", "fim") if getattr(self, f) is not None]
        if len(given) != 1:
            raise bad_request("a request needs exactly one of messages, prompt and fim "
                              f"(got {', '.join(given) or 'none'})", param=self.param_prompt)
        if self.n < 1:
            raise bad_request(f"n must be at least 1 (got {self.n})", param="n")
        if self.prompt is not None and not isinstance(self.prompt, str):
            if not self.prompt:
                raise bad_request("the prompt has no tokens", param=self.param_prompt)
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                       for t in self.prompt):
                raise bad_request("a token-id prompt is a list of non-negative integers",
                                  param=self.param_prompt)
        if (self.tools or self.tool_choice is not None) and self.messages is None:
            raise bad_request("tools need a chat request (messages)", param="tools")

    @property
    def kind(self) -> str:
        """"chat", "prompt" or "fim": what the model reads."""
        return "chat" if self.messages is not None else "fim" if self.fim is not None \
            else "prompt"

    def turn_args(self) -> dict[str, Any]:
        """The keyword arguments of edgespec.agents.prepare_turn this request sets."""
        return {"tools": list(self.tools) if self.tools is not None else None,
                "tool_choice": self.tool_choice,
                "parallel_tool_calls": self.parallel_tool_calls,
                "chat_template_kwargs": self.chat_template_kwargs}
