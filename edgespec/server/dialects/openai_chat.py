"""OpenAI chat completions: ``POST /v1/chat/completions`` (and ``/chat/completions``, as
llama-server also answers), over the protocol core.

parse() maps the validated body (server.schemas) onto a CoreRequest: the refusals of
fields this server cannot honour name the field; ``max_completion_tokens`` wins over
``max_tokens`` (OpenAI documents the latter as deprecated); a message's ``name`` reaches
the model (protocol.engine_input). The answer is rendered by server.responses; ``stream_options``
``include_origins`` adds each token's origin to the stream chunks (docs/server.md).
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from ...api.params import GenerationParams
from ...protocol import limits
from ...protocol.core import Core
from ...protocol.errors import bad_request, unsupported
from ...protocol.request import CoreRequest
from ..schemas import ChatCompletionRequest, Message
from ..settings import ServerSettings
from .openai_common import answer, common_sampling, refuse_common

ROUTES = ("/v1/chat/completions", "/chat/completions")


def register(app: FastAPI, core: Core, settings: ServerSettings) -> None:
    async def chat_completions(request: Request) -> Response:
        return await answer(request, core, settings, ChatCompletionRequest, "chat",
                            lambda req, n_vocab: [parse(req, settings, n_vocab)])

    for path in ROUTES:
        app.add_api_route(path, chat_completions, methods=["POST"])


def parse(req: ChatCompletionRequest, settings: ServerSettings, n_vocab: int) -> CoreRequest:
    refuse_common(req)
    if req.functions:
        raise unsupported("functions", "functions (OpenAI's deprecated function calling) is not "
                                       "supported; declare them as tools")
    if req.function_call not in (None, "none"):
        raise unsupported("function_call", "function_call is deprecated and not supported; "
                                           "use tool_choice")
    if req.modalities not in (None, ["text"]):
        raise unsupported("modalities", "only text output is supported")
    for field in ("audio", "prediction", "reasoning_effort"):
        if getattr(req, field) is not None:
            raise unsupported(field, f"{field} is not supported by this server; leave it out")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    # OpenAI: max_completion_tokens replaces the deprecated max_tokens; both sent, it wins
    asked, param = ((req.max_completion_tokens, "max_completion_tokens")
                    if req.max_completion_tokens is not None else (req.max_tokens, "max_tokens"))
    params = GenerationParams(
        max_tokens=limits.max_tokens(asked, settings.max_tokens_limit, param),
        stop=limits.stops(req.stop), chat=True,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        sampling=common_sampling(req, settings, n_vocab), **_response_format(req))
    return CoreRequest(
        model=req.model, params=params,
        messages=tuple(_message(i, m) for i, m in enumerate(req.messages)),
        tools=tuple(req.tools) if req.tools is not None else None,
        tool_choice=req.tool_choice, parallel_tool_calls=req.parallel_tool_calls,
        reasoning_format=req.reasoning_format, chat_template_kwargs=req.chat_template_kwargs,
        n=req.n or 1, proposer=req.proposer,
        origins=bool(req.stream and req.stream_options and req.stream_options.include_origins),
        param_prompt="messages")


def _response_format(req: ChatCompletionRequest) -> dict[str, Any]:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return {}
    if rf.type == "json_object":
        return {"json_mode": True}
    if rf.json_schema is None or not rf.json_schema.schema_:
        raise bad_request("response_format json_schema needs json_schema.schema (a JSON "
                          "schema object)", param="response_format.json_schema")
    return {"json_schema": rf.json_schema.schema_}


def _message(i: int, m: Message) -> dict[str, Any]:
    """One message, OpenAI-shaped; its tool calls and tool-result ids are checked with the
    turn (edgespec.agents), which knows the whole conversation."""
    where = f"messages.{i}"
    if m.content is None and not m.tool_calls:
        raise bad_request(f"{where}.content is missing", param=f"{where}.content")
    text = None if m.content is None else (
        m.content if isinstance(m.content, str) else "\n".join(p.text for p in m.content))
    role = "system" if m.role == "developer" else m.role
    msg: dict[str, Any] = {"role": role, "content": text}
    if m.tool_calls:
        msg["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        msg["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        msg["name"] = m.name
    return msg
