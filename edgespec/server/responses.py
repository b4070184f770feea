"""Core events -> OpenAI response bodies (chat and completions, whole and streamed): pure
functions of :mod:`edgespec.protocol.events`, with the ``edgespec`` extension object (the
request's speculation stats, per-token origins on request) and llama-server's ``timings``.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from ..api.events import TokenLogprob
from ..protocol.events import (ChoiceDone, CoreEvent, ReasoningDelta, TextDelta, TokenPiece,
                               ToolCallDelta)

#: OpenAI has no "cancelled": a cancelled answer stopped (the exact reason stays in
#: edgespec.stop_reason)
_FINISH = {"cancelled": "stop"}


def finish_reason(done: ChoiceDone) -> str:
    return _FINISH.get(done.finish, done.finish)


def extension(done: ChoiceDone, identity: str) -> dict[str, Any]:
    s = done.stats
    return {
        "proposer": s.proposer,
        "stop_reason": done.stop_reason,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": s.acceptance_rate,
        "verify_passes": s.verify_passes,
        "plain_steps": s.plain_steps,
        "mean_accepted_length": s.mean_accepted_length,
        "accepted_length_hist": {str(k): v for k, v in sorted(s.accepted_length_hist.items())},
        "fallbacks": s.control_events.get("fallback", 0),
        "control_events": dict(s.control_events),
        "prompt_reused": s.prompt_reused,
        "ttft_seconds": s.ttft_seconds,
        "decode_tokens_per_second": s.decode_tokens_per_second,
        "identity": identity,
    }


def usage(dones: list[ChoiceDone]) -> dict[str, Any]:
    """The request's usage: each prompt once (the n choices of a prompt share it), every
    completion."""
    firsts = {d.request: d for d in reversed(dones)}.values()
    prompt = sum(d.prompt_tokens for d in firsts)
    completion = sum(d.completion_tokens for d in dones)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(d.prompt_cached for d in firsts)}}


def origins(tokens: tuple[TokenPiece, ...]) -> dict[str, Any]:
    """The per-token origins extension of a stream chunk (stream_options.include_origins)."""
    return {"tokens": [{"text": t.text, "origin": t.origin, "drafted": t.drafted,
                        "position": t.position} for t in tokens]}


@dataclass
class Shape:
    """One response's constant parts and how its logprobs are written."""

    kind: str  # "chat" | "completion"
    model: str
    fingerprint: str
    piece: Callable[[int], bytes]  # token id -> bytes (the target's token_piece)
    identity: str = ""
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # choice -> characters emitted (text_offset)
    offsets: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        self.id = self.id or prefix + uuid.uuid4().hex

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    # --- logprobs -------------------------------------------------------------------------
    def _token(self, tok: int) -> tuple[str, list[int]]:
        raw = bytes(self.piece(tok))
        return raw.decode("utf-8", "replace"), list(raw)

    def logprobs(self, lps: tuple[TokenLogprob, ...], at: int = 0) -> dict[str, Any] | None:
        """Chat's ``content`` list, or completions' parallel lists (``at``: the text offset
        of the first token)."""
        if not lps:
            return None
        if self.kind == "chat":
            content = []
            for lp in lps:
                tok, raw = self._token(lp.token)
                top = []
                for t, v in lp.top:
                    s, b = self._token(t)
                    top.append({"token": s, "logprob": v, "bytes": b})
                content.append({"token": tok, "logprob": lp.logprob, "bytes": raw,
                                "top_logprobs": top})
            return {"content": content, "refusal": None}
        tokens, offsets, tops = [], [], []
        for lp in lps:
            tok, _ = self._token(lp.token)
            tokens.append(tok)
            offsets.append(at)
            at += len(tok)
            tops.append({self._token(t)[0]: v for t, v in lp.top})
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": tops, "text_offset": offsets}

    # --- whole responses ------------------------------------------------------------------
    def whole(self, dones: list[ChoiceDone],
              echoed: dict[int, str] | None = None) -> dict[str, Any]:
        """The whole body of a request's choices (``echoed``: per choice, the prompt text
        its completion starts with, outside the logprobs' offsets)."""
        choices = []
        for d in dones:
            lps = self.logprobs(d.logprobs, len((echoed or {}).get(d.index, "")))
            if self.kind == "chat":
                msg: dict[str, Any] = {
                    "role": "assistant",
                    "content": d.text if d.text or not d.tool_calls else None}
                if d.reasoning:
                    msg["reasoning_content"] = d.reasoning
                if d.tool_calls:
                    msg["tool_calls"] = [{"id": c.id, "type": "function",
                                          "function": {"name": c.name,
                                                       "arguments": c.arguments}}
                                         for c in d.tool_calls]
                msg["refusal"] = None
                choices.append({"index": d.index, "message": msg, "logprobs": lps,
                                "finish_reason": finish_reason(d)})
            else:
                choices.append({"index": d.index, "text": d.text, "logprobs": lps,
                                "finish_reason": finish_reason(d)})
        body = self._head("chat.completion" if self.kind == "chat" else "text_completion")
        body.update(choices=choices, usage=usage(dones), timings=dones[0].timings,
                    edgespec=extension(dones[0], self.identity))
        if len(dones) > 1:
            body["edgespec"]["choices"] = [dict(extension(d, self.identity), timings=d.timings)
                                           for d in dones]
        return body

    # --- stream chunks --------------------------------------------------------------------
    def chunk(self, index: int, *, text: str = "", delta: dict[str, Any] | None = None,
              lps: tuple[TokenLogprob, ...] = (), finish: str | None = None) -> dict[str, Any]:
        """One choice's chunk: chat's ``delta`` (default: ``text`` as content), or
        completions' ``text``."""
        if self.kind == "chat":
            choice = {"index": index, "delta": {"content": text} if delta is None else delta,
                      "logprobs": self.logprobs(lps), "finish_reason": finish}
            body = self._head("chat.completion.chunk")
        else:
            at = self.offsets.get(index, 0)
            choice = {"index": index, "text": text, "logprobs": self.logprobs(lps, at),
                      "finish_reason": finish}
            self.offsets[index] = at + len(text)
            body = self._head("text_completion")
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None
        return body

    def first(self, index: int) -> dict[str, Any]:
        """A chat choice's opening chunk (the role); completions have none."""
        return self.chunk(index, delta={"role": "assistant", "content": ""})

    def event(self, ev: CoreEvent) -> list[dict[str, Any]]:
        """The stream chunks of one core event."""
        if isinstance(ev, TextDelta):
            if not (ev.text or ev.logprobs or ev.tokens):
                return []
            if self.kind == "chat":
                body = self.chunk(ev.index, delta={"content": ev.text} if ev.text else {},
                                  lps=ev.logprobs)
            else:
                body = self.chunk(ev.index, text=ev.text, lps=ev.logprobs)
            if ev.tokens:
                body["edgespec"] = origins(ev.tokens)
            return [body]
        if isinstance(ev, ReasoningDelta):
            if self.kind != "chat":
                return [self.chunk(ev.index, text=ev.text)]
            return [self.chunk(ev.index, delta={"reasoning_content": ev.text})]
        if isinstance(ev, ToolCallDelta):
            call: dict[str, Any] = {"index": ev.call}
            if ev.id is not None:
                call.update(id=ev.id, type="function",
                            function={"name": ev.name, "arguments": ev.arguments})
            else:
                call["function"] = {"arguments": ev.arguments}
            return [self.chunk(ev.index, delta={"tool_calls": [call]})]
        if isinstance(ev, ChoiceDone):
            body = self.chunk(ev.index, delta={}, finish=finish_reason(ev))
            body["timings"] = ev.timings
            body["edgespec"] = extension(ev, self.identity)
            return [body]
        return []

    def usage_chunk(self, dones: list[ChoiceDone]) -> dict[str, Any]:
        body = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body.update(choices=[], usage=usage(dones), timings=dones[0].timings)
        return body
