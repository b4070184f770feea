"""The OpenAI request bodies this server accepts, validated strictly (pydantic, JSON mode).

Every field this server knows is named here. A field that is not is ignored and named in
the server log (real clients send fields of newer API versions: ``parse_request``), or,
with ``--strict``, refused (400, with the field as ``param``). A known field whose value
this server cannot honour (``functions``, ``best_of``; ``n`` beyond ``--parallel``) is always refused: a request is never
answered with some of its meaning dropped. Types are strict: ``"max_tokens": "5"`` is a type
error, not 5, and NaN or infinite numbers are refused.

Fields accepted but without effect are only those that cannot change the answer
(``user``, ``metadata``, ``store``, ``service_tier``, ``parallel_tool_calls`` without tools,
``stream_options.include_obfuscation``, a message's ``reasoning_content``); docs/server.md lists them.
"""
from __future__ import annotations

import json
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class _Strict(BaseModel):
    model_config = _STRICT


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # padding against length side channels: no effect here
    include_origins: bool = False  # edgespec: each chunk's tokens with their origins (drafted by)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None  # a participant's name (a tool result's: its function's)
    tool_calls: list[Any] | None = None  # an assistant's calls (checked by edgespec.agents)
    tool_call_id: str | None = None  # the call a role "tool" message answers
    refusal: str | None = None
    reasoning_content: str | None = None  # an earlier answer's reasoning, sent back: not rendered


class JsonSchemaFormat(_Strict):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(**_STRICT, populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class CommonRequest(_Strict):
    """What chat and completions requests share."""

    model: str | None = None  # none: the server's default model
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = Field(default=None, ge=0, lt=2**64)  # what numpy's generator takes
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # llama.cpp-style extensions (llama-server takes the same names)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, lt=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)


class ChatCompletionRequest(CommonRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None  # validated by edgespec.agents.tools (JSON Schema)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # llama-server's extensions: template variables (enable_thinking, ...) and the reasoning
    # split for this request (the server's --reasoning-format by default)
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: Literal["none", "deepseek", "auto"] | None = None
    # edgespec's extension: the proposer this request drafts with, one its model has loaded
    # ("none": the plain path; GET /v1/edgespec/status lists them); default: the model's own
    proposer: str | None = Field(default=None, min_length=1, max_length=64)
    # accepted so that a refusal can name them (mapping.chat_request)
    functions: list[Any] | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(CommonRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None


R = TypeVar("R", bound=BaseModel)


def parse_request(model: type[R], body: str, *, strict: bool) -> tuple[R, list[str]]:
    """``body`` validated as ``model``, and the unknown fields that were dropped to get
    there (dotted paths, ``messages.0.foo``). With ``strict`` an unknown field is an error
    like any other (pydantic's ``extra_forbidden``)."""
    try:
        return model.model_validate_json(body), []
    except ValidationError as e:
        unknown = [err["loc"] for err in e.errors() if err["type"] == "extra_forbidden"]
        if strict or not unknown:
            raise
        data = json.loads(body)  # valid JSON: pydantic got as far as the fields
        dropped = [p for p in (_drop(data, loc) for loc in unknown) if p]
        if len(dropped) < len(unknown):
            raise  # a field that could not be located: refuse rather than guess
    return model.model_validate_json(json.dumps(data)), dropped


def _drop(data: Any, loc: tuple[Any, ...]) -> str | None:
    """Remove the field at pydantic's ``loc`` from ``data``; its dotted path, or None when
    it is not there. A union adds its member's name to the path (``list[TextPart]``):
    names not in the data are skipped."""
    path, node = [], data
    for key in loc[:-1]:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            continue
        path.append(str(key))
    last = loc[-1]
    if not isinstance(node, dict) or last not in node:
        return None
    del node[last]
    return ".".join([*path, str(last)])
