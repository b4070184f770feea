"""Anthropic Messages: ``POST /v1/messages`` (whole and streamed) and
``POST /v1/messages/count_tokens``, over the protocol core.

What maps to what (docs/server.md, "Anthropic Messages"):

* ``system`` (a string or text blocks) -> a leading system message
* a message's content blocks: ``text`` -> content; an assistant's ``tool_use`` -> an OpenAI
  tool call (``input`` as its JSON arguments); a user's ``tool_result`` -> a ``tool`` message
  answering that call (a result naming no earlier ``tool_use`` is refused); ``thinking``
  blocks sent back are dropped (templates do not render earlier reasoning)
* ``tools`` (``name``, ``description``, ``input_schema``) -> function tools;
  ``tool_choice`` auto / any / tool / none -> auto / required / the named function / none;
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``
* ``max_tokens`` (required), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``;
  ``output_config.format`` json_schema -> structured output under the schema's grammar
* ``thinking`` enabled -> the reasoning split, rendered as ``thinking`` blocks; disabled ->
  the template's ``enable_thinking`` false (Qwen3-style templates skip the block)

The answer: content blocks (thinking, text, tool_use) and ``stop_reason`` end_turn /
max_tokens / stop_sequence / tool_use; a stream is Anthropic's event sequence
(message_start, content_block_start / _delta / _stop per block, message_delta, message_stop)
with each SSE ``event:`` named like its ``type``. Errors are Anthropic-shaped:
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from ...api.params import GenerationParams
from ...protocol import limits
from ...protocol.core import Core, Running
from ...protocol.events import ChoiceDone, CoreEvent, ReasoningDelta, TextDelta, ToolCallDelta
from ...protocol.engine_input import engine_input
from ...protocol.request import CoreRequest
from ..body import read
from ..settings import ServerSettings
from .fields import (ToolShape, check, function_tools, get, invalid, load_object, number,
                     strings, unsupported)
from .named_sse import named_events
from .refusal import counted, refusing

log = logging.getLogger("edgespec.server")

#: Anthropic's error ``type`` per HTTP status (529 is Anthropic's own "overloaded")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}

#: the top-level fields this dialect reads; others are ignored and named in one log line
KNOWN = frozenset({"model", "messages", "system", "max_tokens", "stop_sequences", "stream",
                   "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking",
                   "metadata", "service_tier", "output_config"})


# --- parsing ---------------------------------------------------------------------------------
def parse(text: str, settings: ServerSettings, *,
          count_only: bool = False) -> tuple[CoreRequest, bool]:
    """The request body -> (CoreRequest, stream). ``count_only`` (count_tokens) needs no
    ``max_tokens``."""
    body = load_object(text)
    ignored = sorted(set(body) - KNOWN)
    if ignored:
        log.warning("/v1/messages: ignored unknown request fields: %s", ", ".join(ignored))
    model = get(body, "model", str, required=True)
    stream = get(body, "stream", bool, default=False)
    messages = _messages(body)
    tools = function_tools(body, _TOOLS)
    tool_choice, parallel = _tool_choice(body, tools)
    reasoning_format, template_kwargs = _thinking(body)
    get(body, "metadata", dict)  # accepted: user_id and the like change no answer
    if count_only:
        max_tokens = 1
    else:
        asked = get(body, "max_tokens", int, required=True)
        if asked < 1:
            raise invalid(f"max_tokens is {asked}; send at least 1", param="max_tokens")
        max_tokens = limits.max_tokens(asked, settings.max_tokens_limit)
    stops = limits.stops(strings(body, "stop_sequences"), param="stop_sequences")
    temperature = number(body, "temperature", "", 0.0, 1.0)
    top_p = number(body, "top_p", "", 0.0, 1.0)
    top_k = number(body, "top_k", "", 0, 1 << 30, integer=True)
    if top_p == 0.0:
        raise invalid("top_p is 0; send a value in (0, 1]", param="top_p")
    sampling = limits.sampling(temperature=temperature, top_p=top_p, top_k=top_k,
                               default_temperature=settings.default_temperature)
    params = GenerationParams(max_tokens=max_tokens, stop=stops, chat=True, sampling=sampling,
                              **_output_format(body))
    return CoreRequest(model=model, params=params, messages=tuple(messages),
                       tools=tuple(tools) if tools else None, tool_choice=tool_choice,
                       parallel_tool_calls=parallel, reasoning_format=reasoning_format,
                       chat_template_kwargs=template_kwargs), stream


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Anthropic's system and messages -> OpenAI-shaped chat messages."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    msgs = get(body, "messages", list, required=True)
    if not msgs:
        raise invalid("messages is empty; send at least one user message", param="messages")
    calls: set[str] = set()  # tool_use ids of earlier assistant messages
    for i, m in enumerate(msgs):
        where = f"messages.{i}"
        check(m, dict, where)
        role = get(m, "role", str, where, required=True)
        if role not in ("user", "assistant"):
            raise invalid(f"{where}.role is {role!r}; Anthropic messages are 'user' or "
                          "'assistant' (the system prompt is the top-level 'system')",
                          param=f"{where}.role")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        check(content, list, f"{where}.content")
        if role == "assistant":
            out.append(_assistant(content, where, calls))
        else:
            out += _user(content, where, calls)
    return out


def _assistant(blocks: list[Any], where: str, calls: set[str]) -> dict[str, Any]:
    texts, tool_calls = [], []
    for j, b in enumerate(blocks):
        at = f"{where}.content.{j}"
        kind = _block_type(b, at)
        if kind == "text":
            texts.append(get(b, "text", str, at, required=True))
        elif kind == "tool_use":
            call_id = get(b, "id", str, at, required=True)
            name = get(b, "name", str, at, required=True)
            args = get(b, "input", dict, at, default={})
            calls.add(call_id)
            tool_calls.append({"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": json.dumps(args)}})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning: chat templates do not render it
        else:
            raise unsupported(f"{at}: a {kind!r} block is not supported in an assistant "
                              "message; send text and tool_use blocks", f"{at}.type")
    msg: dict[str, Any] = {"role": "assistant",
                           "content": "".join(texts) if texts or not tool_calls else None}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def _user(blocks: list[Any], where: str, calls: set[str]) -> list[dict[str, Any]]:
    """A user message's blocks: its tool results first (each a ``tool`` message, in order),
    then its text as one user message."""
    out, texts = [], []
    for j, b in enumerate(blocks):
        at = f"{where}.content.{j}"
        kind = _block_type(b, at)
        if kind == "text":
            texts.append(get(b, "text", str, at, required=True))
        elif kind == "tool_result":
            call_id = get(b, "tool_use_id", str, at, required=True)
            if call_id not in calls:
                raise invalid(f"{at}.tool_use_id {call_id!r} answers no tool_use block of an "
                              "earlier assistant message; send that assistant message with "
                              "its tool_use block first", param=f"{at}.tool_use_id")
            content = b.get("content")
            result = "" if content is None else _text_of(content, f"{at}.content")
            if get(b, "is_error", bool, at, default=False):
                result = "Error: " + result
            out.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            raise unsupported(f"{at}: a {kind!r} block is not supported (this server reads "
                              "text and tool_result blocks in user messages)", f"{at}.type")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _block_type(block: Any, at: str) -> str:
    check(block, dict, at)
    kind: str = get(block, "type", str, at, required=True)
    return kind


def _text_of(value: Any, where: str) -> str:
    """A string, or text blocks joined (``system``, a tool_result's ``content``)."""
    if isinstance(value, str):
        return value
    check(value, list, where)
    texts = []
    for j, b in enumerate(value):
        at = f"{where}.{j}"
        kind = _block_type(b, at)
        if kind != "text":
            raise unsupported(f"{at}: a {kind!r} block is not supported here; send text",
                              f"{at}.type")
        texts.append(get(b, "text", str, at, required=True))
    return "\n".join(texts)


#: Anthropic's custom tools; its server tools (web search, ...) are not served
_TOOLS = ToolShape(kind="custom", default_kind="custom",
                   refusal="Anthropic's server tools are not available here; declare a "
                           "custom tool with name, description and input_schema",
                   schema="input_schema", schema_required=True, strict=False)


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]]) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice -> (OpenAI tool_choice, parallel_tool_calls)."""
    choice = get(body, "tool_choice", dict)
    if choice is None:
        return None, None
    kind = get(choice, "type", str, "tool_choice", required=True)
    parallel = get(choice, "disable_parallel_tool_use", bool, "tool_choice")
    parallel = None if parallel is None else not parallel
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        name = get(choice, "name", str, "tool_choice", required=True)
        return {"type": "function", "function": {"name": name}}, parallel
    raise invalid(f"tool_choice.type {kind!r}; use 'auto', 'any', 'tool' or 'none'",
                  param="tool_choice.type")


def _thinking(body: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """``thinking`` -> (reasoning_format, chat_template_kwargs)."""
    thinking = get(body, "thinking", dict)
    if thinking is None:
        return None, None
    kind = get(thinking, "type", str, "thinking", required=True)
    if kind in ("enabled", "adaptive"):
        get(thinking, "budget_tokens", int, "thinking")  # the answer's max_tokens bounds it
        return "deepseek", None
    if kind == "disabled":
        return None, {"enable_thinking": False}
    raise invalid(f"thinking.type {kind!r}; use 'enabled' or 'disabled'", param="thinking.type")


def _output_format(body: dict[str, Any]) -> dict[str, Any]:
    """``output_config.format`` (structured output) -> GenerationParams' json_schema;
    ``output_config.effort`` is accepted without effect (the model's own effort)."""
    config = get(body, "output_config", dict, default={})
    fmt = get(config, "format", dict, "output_config")
    if fmt is None:
        return {}
    kind = get(fmt, "type", str, "output_config.format", required=True)
    if kind != "json_schema":
        raise invalid(f"output_config.format.type {kind!r}; use 'json_schema'",
                      param="output_config.format.type")
    return {"json_schema": get(fmt, "schema", dict, "output_config.format", required=True)}


# --- rendering -------------------------------------------------------------------------------
def new_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_reason(done: ChoiceDone) -> str:
    if done.finish == "tool_calls":
        return "tool_use"
    if done.finish == "length":
        return "max_tokens"
    if done.stop_reason == "stop":
        return "stop_sequence"
    return "end_turn"


def matched_stop(done: ChoiceDone, stops: tuple[str, ...]) -> str | None:
    """The stop sequence that ended the answer. The engine reports that *a* stop string
    matched, not which: with one sequence asked for that is the one (with several, null)."""
    if done.stop_reason == "stop" and len(stops) == 1:
        return stops[0]
    return None


def usage(done: ChoiceDone) -> dict[str, Any]:
    """Anthropic counts prompt tokens read from a cache apart from ``input_tokens``."""
    reused = min(done.prompt_cached, done.prompt_tokens)
    return {"input_tokens": done.prompt_tokens - reused, "output_tokens": done.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": reused}


def content_blocks(done: ChoiceDone) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if done.reasoning:
        blocks.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
    if done.text or not done.tool_calls:
        blocks.append({"type": "text", "text": done.text})
    for call in done.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": _arguments(call.arguments)})
    return blocks


def message(done: ChoiceDone, model: str, stops: tuple[str, ...],
            msg_id: str = "") -> dict[str, Any]:
    """The whole (non-streamed) answer."""
    return {"id": msg_id or new_id(), "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(done), "stop_reason": stop_reason(done),
            "stop_sequence": matched_stop(done, stops), "usage": usage(done),
            "timings": done.timings}


def _arguments(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}  # the core hands only calls whose arguments parsed; never expected
    return value if isinstance(value, dict) else {}


@dataclass
class MessageStream:
    """Core events -> Anthropic's SSE events, as (event name, data) pairs.

    Blocks open as their kind of output arrives (thinking, text, one per tool call) and
    close when another kind starts; every ``content_block_start`` has its
    ``content_block_stop`` before the next block starts."""

    model: str
    stops: tuple[str, ...] = ()
    id: str = field(default_factory=new_id)
    _index: int = -1  # the open block's index (-1: none open yet)
    _open: str | None = None  # "thinking" | "text" | "tool_use"
    _call: int | None = None  # the open tool_use block's call number

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        # input_tokens is known once the prompt is tokenized: message_delta's usage has it
        msg: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": msg}),
                ("ping", {"type": "ping"})]

    def feed(self, event: CoreEvent) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(event, ReasoningDelta):
            return self._delta("thinking", {"type": "thinking", "thinking": "", "signature": ""},
                               {"type": "thinking_delta", "thinking": event.text}, event.text)
        if isinstance(event, TextDelta):
            return self._delta("text", {"type": "text", "text": ""},
                               {"type": "text_delta", "text": event.text}, event.text)
        if isinstance(event, ToolCallDelta):
            return self._tool(event)
        if isinstance(event, ChoiceDone):
            return self.finish(event)
        return []

    def finish(self, done: ChoiceDone) -> list[tuple[str, dict[str, Any]]]:
        out = self._close()
        if self._index < 0:  # nothing was generated: one empty text block, as Anthropic sends
            out += self._open_block("text", {"type": "text", "text": ""}) + self._close()
        out.append(("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(done),
                      "stop_sequence": matched_stop(done, self.stops)},
            "usage": usage(done), "timings": done.timings}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    # --- pieces ---------------------------------------------------------------------------
    def _delta(self, kind: str, start: dict[str, Any], delta: dict[str, Any],
               text: str) -> list[tuple[str, dict[str, Any]]]:
        if not text:
            return []
        out = [] if self._open == kind else self._close() + self._open_block(kind, start)
        out.append(("content_block_delta", {"type": "content_block_delta",
                                            "index": self._index, "delta": delta}))
        return out

    def _tool(self, ev: ToolCallDelta) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        if self._open != "tool_use" or self._call != ev.call:
            out += self._close() + self._open_block(
                "tool_use", {"type": "tool_use", "id": ev.id or "", "name": ev.name or "",
                             "input": {}})
            self._call = ev.call
        if ev.arguments:
            out.append(("content_block_delta", {
                "type": "content_block_delta", "index": self._index,
                "delta": {"type": "input_json_delta", "partial_json": ev.arguments}}))
        return out

    def _open_block(self, kind: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        self._index += 1
        self._open = kind
        return [("content_block_start", {"type": "content_block_start", "index": self._index,
                                         "content_block": block})]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self._open is None:
            return []
        self._open, self._call = None, None
        return [("content_block_stop", {"type": "content_block_stop", "index": self._index})]


# --- errors ----------------------------------------------------------------------------------
def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def events_text(pairs: Iterable[tuple[str, dict[str, Any]]]) -> str:
    """SSE text of (event, data) pairs (what the route streams; tests read it back)."""
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in pairs)


# --- routes ----------------------------------------------------------------------------------
def register(app: FastAPI, core: Core, settings: ServerSettings) -> None:
    """``POST /v1/messages`` and ``/v1/messages/count_tokens`` on ``core``."""
    @app.post("/v1/messages")
    @refusing(_refusal)
    async def messages(request: Request) -> Response:
        req, stream = parse(await read(request, settings), settings)
        model = req.model or settings.served_model
        if stream:
            run = await core.start(request, req)
            return EventSourceResponse(_sse(run, MessageStream(model, req.params.stop)),
                                       sep="\n", ping=15)
        done = (await core.complete(request, req))[0]
        return JSONResponse(message(done, model, req.params.stop))

    @app.post("/v1/messages/count_tokens")
    @refusing(_refusal)
    async def messages_count_tokens(request: Request) -> Response:
        req, _ = parse(await read(request, settings), settings, count_only=True)
        return JSONResponse({"input_tokens": await count_tokens(core, req)})


def _sse(run: Running, stream: MessageStream) -> AsyncIterator[dict[str, str]]:
    # a failure mid-stream: Anthropic's in-stream error event
    return named_events(run, stream, lambda err: ("error", error_body(err.status, err.message)))



async def count_tokens(core: Core, req: CoreRequest) -> int:
    """The prompt tokens ``req`` would take: its turn planned (template, tools) and
    tokenized as the engine tokenizes it, on a worker thread."""
    fmt = getattr(core.settings, "reasoning_format", "auto")
    async with core.held(req.model) as held:
        def count() -> int:
            p = engine_input(held.engine, req, held.name, fmt)
            if isinstance(p.prompt, tuple):  # token ids (a Messages request lowers to messages)
                return len(p.prompt)
            return len(held.engine.prompt_tokens(p.prompt, p.params))
        return await asyncio.to_thread(count)


def _refusal(request: Request, e: BaseException) -> JSONResponse:
    err = counted(request, e)
    return JSONResponse(error_body(err.status, err.message), status_code=err.status,
                        headers=err.headers)
