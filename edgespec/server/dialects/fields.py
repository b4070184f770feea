"""Reading a JSON request body field by field, for the dialects parsed by hand (Anthropic
Messages, OpenAI Responses): strict types with the field's path in every refusal.

A dialect whose wire format is a tree of tagged unions (content blocks, input items) reads
more clearly as a walk over dicts than as a pydantic model per tag, and each refusal can say
exactly what to send instead. Types are strict as in the OpenAI routes: ``"max_tokens": "5"``
is a type error, ``true`` is not a number, NaN and infinities are refused.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ...protocol.errors import ProtocolError

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               dict: "an object", list: "an array"}


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ProtocolError:
    return ProtocolError(400, message, kind="invalid_request", param=param, code=code)


def unsupported(message: str, param: str) -> ProtocolError:
    return ProtocolError(400, message, kind="unsupported", param=param,
                         code="unsupported_parameter")


def load_object(text: str) -> dict[str, Any]:
    """The body as a JSON object."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep to parse
        raise invalid(f"the request body is not valid JSON ({e}); send one JSON object",
                      code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_type")
    return body


def join(where: str, key: str | int) -> str:
    return f"{where}.{key}" if where else str(key)


def get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "", *,
        required: bool = False, default: Any = None) -> Any:
    """``obj[key]`` checked to be of ``kind``; ``default`` when absent or null (unless
    ``required``)."""
    path = join(where, key)
    value = obj.get(key)
    if value is None:
        if required:
            raise invalid(f"{path} is required", param=path, code="missing_required_parameter")
        return default
    check(value, kind, path)
    return value


def check(value: Any, kind: type | tuple[type, ...], path: str) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = False
    for k in kinds:
        if k is float:
            ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool))
        elif k is int:
            ok = ok or (isinstance(value, int) and not isinstance(value, bool))
        else:
            ok = ok or isinstance(value, k)
    if not ok:
        names = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise invalid(f"{path} must be {names}, not {_json_type(value)}", param=path,
                      code="invalid_type")
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid(f"{path} must be a finite number", param=path, code="invalid_value")


def number(obj: dict[str, Any], key: str, where: str, lo: float, hi: float, *,
           integer: bool = False) -> Any:
    """An optional number within [lo, hi]."""
    value = get(obj, key, int if integer else float, where)
    if value is not None and not lo <= value <= hi:
        path = join(where, key)
        raise invalid(f"{path} is {value}; send a value in [{lo:g}, {hi:g}]", param=path)
    return value


def strings(obj: dict[str, Any], key: str, where: str = "") -> tuple[str, ...]:
    """An optional list of strings."""
    values = get(obj, key, list, where, default=[])
    for i, v in enumerate(values):
        check(v, str, f"{join(where, key)}.{i}")
    return tuple(values)


@dataclass(frozen=True)
class ToolShape:
    """How a dialect declares a function tool: the one ``type`` it serves and where the
    parameters' JSON schema sits. The tools become OpenAI's ``{"type": "function",
    "function": {name, description, parameters, strict}}``, what the core reads."""

    kind: str  # the ``type`` served ("custom" in Anthropic's Messages, "function" in Responses)
    default_kind: str | None  # what a tool without ``type`` is; None: ``type`` is required
    refusal: str  # what to say of another type (the dialect's hosted tools)
    schema: str  # the key of the parameters' JSON schema
    schema_required: bool
    strict: bool  # whether an optional ``strict`` flag is read


def function_tools(body: dict[str, Any], shape: ToolShape) -> list[dict[str, Any]]:
    """``body["tools"]`` (optional) as OpenAI function tools, each field checked."""
    tools = get(body, "tools", list, default=[])
    out = []
    for i, t in enumerate(tools):
        at = f"tools.{i}"
        check(t, dict, at)
        kind = get(t, "type", str, at, required=shape.default_kind is None,
                   default=shape.default_kind)
        if kind != shape.kind:
            raise unsupported(f"{at}.type {kind!r}: {shape.refusal}", f"{at}.type")
        fn: dict[str, Any] = {"name": get(t, "name", str, at, required=True)}
        description = get(t, "description", str, at)
        if description is not None:
            fn["description"] = description
        parameters = get(t, shape.schema, dict, at, required=shape.schema_required)
        if parameters is not None:
            fn["parameters"] = parameters
        strict = get(t, "strict", bool, at) if shape.strict else None
        if strict is not None:
            fn["strict"] = strict
        out.append({"type": "function", "function": fn})
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
