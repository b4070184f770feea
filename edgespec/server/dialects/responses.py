"""The OpenAI Responses API: ``POST /v1/responses`` (whole and streamed) and
``GET /v1/responses/{id}``, over the protocol core.

What maps to what (docs/server.md, "OpenAI Responses"):

* ``instructions`` -> a leading system message (not carried to a follow-up, as OpenAI does)
* ``input`` as a string -> one user message; as items: messages (``input_text`` /
  ``output_text`` parts, roles user / assistant / system / developer), ``function_call`` ->
  an assistant tool call (consecutive calls join one assistant message),
  ``function_call_output`` -> a ``tool`` message answering that ``call_id`` (a result
  naming no earlier call is refused); ``reasoning`` items sent back are dropped
* ``previous_response_id`` -> that response's conversation (input and output) before
  ``input``, from the in-memory store (responses_store; an unknown id is a 404)
* function ``tools`` (flat: ``name``, ``description``, ``parameters``), ``tool_choice``,
  ``parallel_tool_calls``, ``max_output_tokens``, ``temperature``, ``top_p``,
  ``text.format`` (text / json_object / json_schema)

The answer's ``output``: a ``reasoning`` item (the reasoning split), a ``message`` item with
``output_text``, one ``function_call`` item per call; ``status`` incomplete with
``incomplete_details.reason`` max_output_tokens when cut short. A stream is the Responses
event sequence, every event with its ``sequence_number`` and the SSE ``event:`` named like
its ``type``.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from ...api.params import GenerationParams
from ...protocol import limits
from ...protocol.core import Core, Running
from ...protocol.errors import ProtocolError
from ...protocol.events import ChoiceDone, CoreEvent, ReasoningDelta, TextDelta, ToolCallDelta
from ...protocol.request import CoreRequest
from ..body import read
from ..errors import response as openai_error
from ..settings import ServerSettings
from .fields import (ToolShape, check, function_tools, get, invalid, load_object, number,
                     unsupported)
from .named_sse import named_events
from .refusal import counted, refusing
from .responses_store import ResponseStore, Stored

log = logging.getLogger("edgespec.server")

#: the top-level fields this dialect reads or accepts without effect; others are ignored
#: and named in one log line
KNOWN = frozenset({"model", "input", "instructions", "previous_response_id", "tools",
                   "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature",
                   "top_p", "text", "stream", "store", "metadata", "user", "reasoning",
                   "truncation", "include", "service_tier", "prompt_cache_key",
                   "safety_identifier", "stream_options", "background", "top_logprobs",
                   "max_tool_calls"})


@dataclass(frozen=True)
class Parsed:
    core: CoreRequest
    stream: bool
    store: bool
    echo: dict[str, Any]  # the request's fields a response object repeats
    # the messages before the answer, instructions excluded
    conversation: tuple[dict[str, Any], ...]


# --- parsing ---------------------------------------------------------------------------------
def parse(text: str, settings: ServerSettings, store: ResponseStore) -> Parsed:
    body = load_object(text)
    ignored = sorted(set(body) - KNOWN)
    if ignored:
        log.warning("/v1/responses: ignored unknown request fields: %s", ", ".join(ignored))
    model = get(body, "model", str)
    stream = get(body, "stream", bool, default=False)
    keep = get(body, "store", bool, default=True)
    if get(body, "background", bool, default=False):
        raise unsupported("background responses are not supported; send the request and "
                          "wait for it (or stream it)", "background")
    instructions = get(body, "instructions", str)
    previous = get(body, "previous_response_id", str)
    history: list[dict[str, Any]] = []
    if previous is not None:
        stored = store.get(previous)
        if stored is None:
            raise ProtocolError(404, f"previous_response_id {previous!r} names no response "
                                     f"this server holds: it keeps the last {store.limit} "
                                     "stored responses in memory, until it restarts; send "
                                     "the whole conversation as input instead",
                                kind="not_found", param="previous_response_id",
                                code="previous_response_not_found")
        history = list(stored.conversation)
    conversation = history + _input(body, history)
    messages = ([{"role": "system", "content": instructions}] if instructions else []) \
        + conversation
    tools = function_tools(body, _TOOLS)
    tool_choice = _tool_choice(body)
    parallel = get(body, "parallel_tool_calls", bool)
    asked = get(body, "max_output_tokens", int)
    if asked is not None and asked < 1:
        raise invalid(f"max_output_tokens is {asked}; send at least 1",
                      param="max_output_tokens")
    temperature = number(body, "temperature", "", 0.0, 2.0)
    top_p = number(body, "top_p", "", 0.0, 1.0)
    if top_p == 0.0:
        raise invalid("top_p is 0; send a value in (0, 1]", param="top_p")
    text_cfg, structured = _text(body)
    sampling = limits.sampling(temperature=temperature, top_p=top_p,
                               default_temperature=settings.default_temperature)
    params = GenerationParams(max_tokens=limits.max_tokens(asked, settings.max_tokens_limit,
                                                           "max_output_tokens"), chat=True,
                              sampling=sampling, **structured)
    reasoning = get(body, "reasoning", dict)
    echo = {"instructions": instructions, "max_output_tokens": asked,
            "model": model or settings.served_model,
            "parallel_tool_calls": True if parallel is None else parallel,
            "previous_response_id": previous, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "text": text_cfg,
            "truncation": body.get("truncation") or "disabled",
            "reasoning": {"effort": (reasoning or {}).get("effort"),
                          "summary": (reasoning or {}).get("summary")},
            "metadata": get(body, "metadata", dict, default={}), "store": keep,
            "user": body.get("user")}
    core = CoreRequest(model=model, params=params, messages=tuple(messages),
                       tools=tuple(tools) if tools else None, tool_choice=tool_choice,
                       parallel_tool_calls=parallel)
    return Parsed(core, stream, keep, echo, tuple(conversation))


def _input(body: dict[str, Any], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    value = body.get("input")
    if value is None:
        raise invalid("input is required: a string or a list of items",
                      param="input", code="missing_required_parameter")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    check(value, (str, list), "input")
    if not value and not history:
        raise invalid("input is empty; send at least one message", param="input")
    calls = {c["id"] for m in history for c in m.get("tool_calls") or ()}
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input.{i}"
        check(item, dict, where)
        kind = get(item, "type", str, where, default="message")
        if kind == "message":
            role = get(item, "role", str, where, required=True)
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"{where}.role is {role!r}; use user, assistant, system or "
                              "developer", param=f"{where}.role")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id = get(item, "call_id", str, where, required=True)
            call = {"id": call_id, "type": "function",
                    "function": {"name": get(item, "name", str, where, required=True),
                                 "arguments": get(item, "arguments", str, where,
                                                  required=True)}}
            calls.add(call_id)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = get(item, "call_id", str, where, required=True)
            if call_id not in calls:
                raise invalid(f"{where}.call_id {call_id!r} answers no function_call before it "
                              "(in input or the previous response); send the function_call "
                              "item first", param=f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            continue  # earlier reasoning: chat templates do not render it
        else:
            raise unsupported(f"{where}.type {kind!r} is not supported; send message, "
                              "function_call, function_call_output or reasoning items",
                              f"{where}.type")
    return out


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or text parts joined."""
    if isinstance(value, str):
        return value
    if value is None:
        raise invalid(f"{where} is required", param=where, code="missing_required_parameter")
    check(value, list, where)
    texts = []
    for j, part in enumerate(value):
        at = f"{where}.{j}"
        check(part, dict, at)
        kind = get(part, "type", str, at, required=True)
        if kind in ("input_text", "output_text", "text"):
            texts.append(get(part, "text", str, at, required=True))
        elif kind == "refusal":
            texts.append(get(part, "refusal", str, at, required=True))
        else:
            raise unsupported(f"{at}.type {kind!r}: only text parts are supported (this "
                              "server serves text models)", f"{at}.type")
    return "".join(texts)


#: Responses' function tools; OpenAI's hosted tools (web search, file search, ...) are not
_TOOLS = ToolShape(kind="function", default_kind=None,
                   refusal="OpenAI's hosted tools are not available here; declare function "
                           "tools",
                   schema="parameters", schema_required=False, strict=True)


def _tool_choice(body: dict[str, Any]) -> Any:
    choice = body.get("tool_choice")
    if choice is None or isinstance(choice, str):
        return choice  # auto / none / required: checked by the core with the tools
    check(choice, dict, "tool_choice")
    kind = get(choice, "type", str, "tool_choice", required=True)
    if kind != "function":
        raise unsupported(f"tool_choice.type {kind!r}: only function tools can be chosen",
                          "tool_choice.type")
    return {"type": "function",
            "function": {"name": get(choice, "name", str, "tool_choice", required=True)}}


def _text(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``text.format`` -> (the text config echoed, GenerationParams' structured fields)."""
    cfg = get(body, "text", dict, default={})
    fmt = get(cfg, "format", dict, "text", default={"type": "text"})
    kind = get(fmt, "type", str, "text.format", required=True)
    echoed = {"format": fmt}
    if kind == "text":
        return echoed, {}
    if kind == "json_object":
        return echoed, {"json_mode": True}
    if kind == "json_schema":
        schema = get(fmt, "schema", dict, "text.format", required=True)
        return echoed, {"json_schema": schema}
    raise invalid(f"text.format.type {kind!r}; use text, json_object or json_schema",
                  param="text.format.type")


# --- rendering -------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(done: ChoiceDone | None) -> dict[str, Any] | None:
    if done is None:
        return None
    return {"input_tokens": done.prompt_tokens,
            "input_tokens_details": {"cached_tokens": min(done.prompt_cached,
                                                          done.prompt_tokens)},
            "output_tokens": done.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def response_object(rid: str, echo: dict[str, Any], created: int, status: str,
                    output: list[dict[str, Any]],
                    done: ChoiceDone | None = None) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    body = {"id": rid, "object": "response", "created_at": created, "status": status,
            "error": None, "incomplete_details": incomplete, **echo, "output": output,
            "usage": usage(done)}
    if done is not None:
        body["timings"] = done.timings
    return body


def status_of(done: ChoiceDone) -> str:
    return "incomplete" if done.finish == "length" else "completed"


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [_text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_items(done: ChoiceDone) -> list[dict[str, Any]]:
    """A whole answer's output items."""
    items = []
    if done.reasoning:
        items.append(reasoning_item(new_id("rs"), done.reasoning))
    if done.text or not done.tool_calls:
        items.append(message_item(new_id("msg"), done.text))
    for call in done.tool_calls:
        items.append(call_item(new_id("fc"), call.id, call.name, call.arguments))
    return items


def answer_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The output as the assistant message a follow-up's conversation continues from."""
    text = "".join(p["text"] for it in output if it["type"] == "message"
                   for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function",
              "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in output if it["type"] == "function_call"]
    msg: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


@dataclass
class _Item:
    kind: str  # "reasoning" | "message" | "function_call"
    id: str
    index: int  # output_index
    text: str = ""  # the reasoning's or message's text, or the call's arguments
    call: int | None = None
    call_id: str = ""
    name: str = ""

    def whole(self, status: str = "completed") -> dict[str, Any]:
        if self.kind == "reasoning":
            return reasoning_item(self.id, self.text, status)
        if self.kind == "message":
            return message_item(self.id, self.text, status)
        return call_item(self.id, self.call_id, self.name, self.text, status)


@dataclass
class ResponseStream:
    """Core events -> the Responses API's stream events, as (event name, data) pairs.

    Output items open as their kind of output arrives (reasoning, message, one per call)
    and are done before the next one is added; ``output`` ends as the items the final
    ``response.completed`` carries (the same ids as streamed)."""

    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created: int = field(default_factory=lambda: int(time.time()))
    output: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] | None = None  # the final response object, once finished
    _seq: int = 0
    _open: _Item | None = None

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        shell = response_object(self.id, self.echo, self.created, "in_progress", [])
        return [self._event("response.created", response=shell),
                self._event("response.in_progress", response=shell)]

    def feed(self, event: CoreEvent) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(event, ReasoningDelta) and event.text:
            out = self._ensure("reasoning")
            item = self._item()
            item.text += event.text
            return out + [self._event("response.reasoning_text.delta", item_id=item.id,
                                      output_index=item.index, content_index=0,
                                      delta=event.text)]
        if isinstance(event, TextDelta) and event.text:
            out = self._ensure("message")
            item = self._item()
            item.text += event.text
            return out + [self._event("response.output_text.delta", item_id=item.id,
                                      output_index=item.index, content_index=0,
                                      delta=event.text, logprobs=[])]
        if isinstance(event, ToolCallDelta):
            out = []
            if self._open is None or self._open.kind != "function_call" \
                    or self._open.call != event.call:
                out += self._close()
                self._open = _Item("function_call", new_id("fc"), len(self.output),
                                   call=event.call, call_id=event.id or new_id("call"),
                                   name=event.name or "")
                out.append(self._event("response.output_item.added",
                                       output_index=self._open.index,
                                       item=self._open.whole("in_progress")))
            item = self._item()
            if event.arguments:
                item.text += event.arguments
                out.append(self._event("response.function_call_arguments.delta",
                                       item_id=item.id, output_index=item.index,
                                       delta=event.arguments))
            return out
        if isinstance(event, ChoiceDone):
            return self.finish(event)
        return []

    def finish(self, done: ChoiceDone) -> list[tuple[str, dict[str, Any]]]:
        out = self._close()
        status = status_of(done)
        final = response_object(self.id, self.echo, self.created, status, self.output, done)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        self.response = final
        return out + [self._event(kind, response=final)]

    def error(self, code: str | None, message: str,
              param: str | None) -> tuple[str, dict[str, Any]]:
        return self._event("error", code=code, message=message, param=param)

    # --- pieces ---------------------------------------------------------------------------
    def _item(self) -> _Item:
        assert self._open is not None
        return self._open

    def _event(self, kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        body = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return kind, body

    def _ensure(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        if self._open is not None and self._open.kind == kind:
            return []
        out = self._close()
        prefix = "rs" if kind == "reasoning" else "msg"
        item = self._open = _Item(kind, new_id(prefix), len(self.output))
        out.append(self._event("response.output_item.added", output_index=item.index,
                               item=item.whole("in_progress")))
        part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" \
            else _text_part("")
        out.append(self._event("response.content_part.added", item_id=item.id,
                               output_index=item.index, content_index=0, part=part))
        return out

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        out = []
        common = {"item_id": item.id, "output_index": item.index}
        if item.kind == "message":
            out.append(self._event("response.output_text.done", **common, content_index=0,
                                   text=item.text, logprobs=[]))
            out.append(self._event("response.content_part.done", **common, content_index=0,
                                   part=_text_part(item.text)))
        elif item.kind == "reasoning":
            out.append(self._event("response.reasoning_text.done", **common, content_index=0,
                                   text=item.text))
            out.append(self._event("response.content_part.done", **common, content_index=0,
                                   part={"type": "reasoning_text", "text": item.text}))
        else:
            out.append(self._event("response.function_call_arguments.done", **common,
                                   name=item.name, arguments=item.text))
        whole = item.whole()
        self.output.append(whole)
        out.append(self._event("response.output_item.done", output_index=item.index,
                               item=whole))
        return out


# --- routes ----------------------------------------------------------------------------------
def register(app: FastAPI, core: Core, settings: ServerSettings,
             store: ResponseStore | None = None) -> None:
    """``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}`` on ``core``, the
    answers kept in ``store`` (a new one of STORE_LIMIT responses by default)."""
    store = store if store is not None else ResponseStore(STORE_LIMIT)
    app.state.responses = store

    @app.post("/v1/responses")
    @refusing(_refusal)
    async def responses(request: Request) -> Response:
        parsed = parse(await read(request, settings), settings, store)
        if parsed.stream:
            run = await core.start(request, parsed.core)
            return EventSourceResponse(_sse(run, ResponseStream(parsed.echo), parsed,
                                            store), sep="\n", ping=15)
        done = (await core.complete(request, parsed.core))[0]
        output = output_items(done)
        body = response_object(new_id("resp"), parsed.echo, int(time.time()),
                               status_of(done), output, done)
        _keep(store, parsed, body)
        return JSONResponse(body)

    @app.get("/v1/responses/{response_id}")
    async def get_response(request: Request, response_id: str) -> Response:
        stored = store.get(response_id)
        if stored is None:
            return _refusal(request, _unknown(response_id))
        return JSONResponse(stored.response)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> Response:
        if not store.delete(response_id):
            return _refusal(request, _unknown(response_id))
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


#: responses kept for previous_response_id and GET (each holds its whole conversation)
STORE_LIMIT = 256


def _unknown(response_id: str) -> ProtocolError:
    return ProtocolError(404, f"no response with id {response_id!r}: this server keeps the "
                              f"last {STORE_LIMIT} stored responses in memory, until it "
                              "restarts", kind="not_found", param="response_id",
                         code="response_not_found")


def _keep(store: ResponseStore, parsed: Parsed, body: dict[str, Any]) -> None:
    if parsed.store:
        store.put(body["id"], Stored(body, parsed.conversation
                                     + (answer_message(body["output"]),)))


def _sse(run: Running, stream: ResponseStream, parsed: Parsed,
         store: ResponseStore) -> AsyncIterator[dict[str, str]]:
    def finished() -> None:  # the whole response, kept for previous_response_id
        if stream.response is not None:
            _keep(store, parsed, stream.response)

    # a failure mid-stream: the stream's error event, in OpenAI's shape
    return named_events(run, stream, lambda err: stream.error(err.code, err.message, err.param),
                        finished)


def _refusal(request: Request, e: BaseException) -> JSONResponse:
    err = counted(request, e)
    return openai_error(err)
