"""The response dicts and stream chunks of ``llama_cpp.Llama`` 0.3.36, built field for field.

These are llama-cpp-python's shapes, not the server's (``edgespec.server.responses`` adds
``system_fingerprint``, ``refusal`` and the ``edgespec`` stats object, which an OpenAI
client expects and an app written against ``Llama`` does not):

- completions: ``id`` ``"cmpl-<uuid4>"``, ``object`` ``"text_completion"`` for the whole
  response and for every chunk; ``usage`` only on the whole response;
- chat: ``id`` ``"chatcmpl-<uuid4>"`` (llama-cpp-python prefixes the completion's id with
  ``"chat"``), ``object`` ``"chat.completion"`` / ``"chat.completion.chunk"``; a stream opens
  with a role-only delta and ends with an empty delta carrying ``finish_reason``;
- ``logprobs`` is None unless asked for; token strings are decoded with ``errors="ignore"``
  and every ``top_logprobs`` entry also holds the chosen token, as llama-cpp-python's do.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..api.events import TokenLogprob

#: the engine's stop reasons, as llama-cpp-python's two finish reasons (a grammar that
#: admits nothing more ended the text like an end-of-generation token; a full context
#: ends it like max_tokens, which llama-cpp-python truncates to the context)
FINISH_REASON = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length",
                 "context": "length", "cancelled": "stop"}


def finish_reason(stop_reason: str) -> str:
    return FINISH_REASON.get(stop_reason, "stop")


@dataclass
class Head:
    """What every dict of one response shares: its id, creation time and model name."""

    kind: str  # "chat" | "completion"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "completion"):
            raise ValueError(f"kind is 'chat' or 'completion' (got {self.kind!r})")
        if not self.id:
            cmpl = f"cmpl-{uuid.uuid4()}"
            self.id = "chat" + cmpl if self.kind == "chat" else cmpl


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


# --- logprobs ----------------------------------------------------------------------------
def completion_logprobs(lps: Sequence[TokenLogprob], piece: Callable[[int], bytes],
                        offset: int) -> dict | None:
    """llama-cpp-python's ``CompletionLogprobs`` for ``lps``, the first token's text starting
    at character ``offset`` of the text (completions count from the end of the prompt)."""
    if not lps:
        return None
    tokens, offsets, values, tops = [], [], [], []
    at = offset
    for lp in lps:
        s = _text(piece, lp.token)
        top = {_text(piece, t): v for t, v in lp.top}
        top[s] = lp.logprob  # llama-cpp-python always lists the chosen token too
        tokens.append(s)
        offsets.append(at)
        values.append(lp.logprob)
        tops.append(top)
        at += len(s)
    return {"tokens": tokens, "text_offset": offsets, "token_logprobs": values,
            "top_logprobs": tops}


def chat_logprobs(logprobs: dict | None) -> dict | None:
    """A completion's logprobs as chat logprobs (llama-cpp-python's
    ``_convert_text_completion_logprobs_to_chat``: no bytes, no refusal)."""
    if logprobs is None:
        return None
    return {"content": [
        {"token": tok, "bytes": None, "logprob": value,
         "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in top.items()]}
        for tok, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"],
                                   logprobs["top_logprobs"])],
        "refusal": None}


def _text(piece: Callable[[int], bytes], tok: int) -> str:
    return bytes(piece(tok)).decode("utf-8", errors="ignore")


# --- whole responses ---------------------------------------------------------------------
def completion(head: Head, text: str, finish: str, use: dict,
               logprobs: dict | None = None) -> dict:
    return {"id": head.id, "object": "text_completion", "created": head.created,
            "model": head.model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
            "usage": use}


def chat_completion(head: Head, content: str, finish: str, use: dict,
                    logprobs: dict | None = None, message: dict | None = None) -> dict:
    """``message`` replaces the plain ``{"role": "assistant", "content": content}`` (an answer
    that calls tools carries ``tool_calls``)."""
    msg = message if message is not None else {"role": "assistant", "content": content}
    return {"id": head.id, "object": "chat.completion", "created": head.created,
            "model": head.model,
            "choices": [{"index": 0, "message": msg, "logprobs": chat_logprobs(logprobs),
                         "finish_reason": finish}],
            "usage": use}


# --- stream chunks -----------------------------------------------------------------------
def completion_chunk(head: Head, text: str, logprobs: dict | None = None,
                     finish: str | None = None) -> dict:
    return {"id": head.id, "object": "text_completion", "created": head.created,
            "model": head.model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]}


def chat_chunk(head: Head, delta: dict, logprobs: dict | None = None,
               finish: str | None = None) -> dict:
    """One chat chunk: the opening ``{"role": "assistant"}``, a ``{"content": ...}`` delta, or
    the closing ``{}`` with its finish reason."""
    return {"id": head.id, "model": head.model, "created": head.created,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": chat_logprobs(logprobs),
                         "finish_reason": finish}]}


__all__ = ["FINISH_REASON", "Head", "chat_chunk", "chat_completion", "chat_logprobs",
           "completion", "completion_chunk", "completion_logprobs", "finish_reason", "usage"]
