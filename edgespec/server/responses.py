"""Engine events -> OpenAI response bodies (chat and completions, whole and streamed), plus
the ``edgespec`` extension object with the request's speculation stats."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..api.events import Finished, TokenLogprob

#: OpenAI has "stop" and "length"; the engine's stop reasons fold into them (the exact one
#: stays in edgespec.stop_reason)
FINISH_REASON = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length",
                 "context": "length", "cancelled": "stop"}


def extension(fin: Finished, identity: str) -> dict:
    s = fin.stats
    return {
        "proposer": s.proposer,
        "stop_reason": fin.stop_reason,
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


def usage(fin: Finished) -> dict:
    s = fin.stats
    completion = len(fin.tokens)
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": completion,
            "total_tokens": s.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": s.prompt_reused}}


@dataclass
class Shape:
    """One response's constant parts and how its logprobs are written."""

    kind: str  # "chat" | "completion"
    model: str
    fingerprint: str
    piece: object  # token id -> bytes (the target's token_piece)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    offset: int = 0  # characters of text emitted so far (completions' text_offset)

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        self.id = self.id or prefix + uuid.uuid4().hex

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    # --- logprobs -------------------------------------------------------------------------
    def _token(self, tok: int) -> tuple[str, list[int]]:
        raw = bytes(self.piece(tok))
        return raw.decode("utf-8", "replace"), list(raw)

    def logprobs(self, lps: tuple[TokenLogprob, ...]) -> dict | None:
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
        at = self.offset
        for lp in lps:
            tok, _ = self._token(lp.token)
            tokens.append(tok)
            offsets.append(at)
            at += len(tok)
            tops.append({self._token(t)[0]: v for t, v in lp.top})
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": tops, "text_offset": offsets}

    # --- whole responses ------------------------------------------------------------------
    def whole(self, fin: Finished, identity: str, message: dict | None = None,
              finish_reason: str | None = None) -> dict:
        """``message`` / ``finish_reason``: a chat turn's own (tool calls, reasoning: an
        edgespec.agents.TurnOutput's), else the text as content and the mapped reason."""
        lps = self.logprobs(tuple(fin.logprobs))
        reason = finish_reason or FINISH_REASON.get(fin.stop_reason, "stop")
        if self.kind == "chat":
            msg = message or {"role": "assistant", "content": fin.text}
            choice = {"index": 0, "message": {**msg, "refusal": None},
                      "logprobs": lps, "finish_reason": reason}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": fin.text, "logprobs": lps, "finish_reason": reason}
            body = self._head("text_completion")
        body.update(choices=[choice], usage=usage(fin), edgespec=extension(fin, identity))
        return body

    # --- stream chunks --------------------------------------------------------------------
    def chunk(self, text: str, lps: tuple[TokenLogprob, ...] = (), *, first: bool = False,
              include_usage: bool = False, delta: dict | None = None) -> dict:
        """``delta``: a chat turn's own (reasoning_content, tool_calls), instead of ``text``
        as content."""
        logprobs = self.logprobs(lps)
        if self.kind == "chat":
            if delta is None:
                delta = {"content": text}
            delta = {"role": "assistant", **delta} if first else delta
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None}
            body = self._head("text_completion")
        self.offset += len(text)
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None
        return body

    def final_chunk(self, fin: Finished, identity: str, include_usage: bool,
                    finish_reason: str | None = None) -> dict:
        body = self.chunk("", include_usage=include_usage)
        choice = body["choices"][0]
        if self.kind == "chat":
            choice["delta"] = {}
        choice["finish_reason"] = finish_reason or FINISH_REASON.get(fin.stop_reason, "stop")
        body["edgespec"] = extension(fin, identity)
        return body

    def usage_chunk(self, fin: Finished) -> dict:
        body = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body.update(choices=[], usage=usage(fin))
        return body
