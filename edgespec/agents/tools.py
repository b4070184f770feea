"""Tool declarations and ``tool_choice``, validated; the grammar a forced call must follow.

OpenAI's shapes::

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "...",
                                                "parameters": {<JSON Schema>}}}, ...]
    tool_choice = "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}

``auto`` lets the model answer or call; ``none`` hides the tools from the model (the
template is rendered without them, nothing is parsed); ``required`` and a named function make
the call the answer: the output is generated under a grammar for the template's call markup
around each function's own parameter schema (edgespec.grammar: the same lossless path as
``response_format``, so speculation stays on and the markup's literals are drafted for free).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError, UnsupportedError
from ..grammar.bounds import check_schema
from ..grammar.constraint import GrammarError, check_schema_supported

#: OpenAI's rule for function names
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("auto", "none", "required")


class ToolError(InvalidInputError):
    """Bad tools or tool_choice; ``param`` names the field, ``code`` the OpenAI error code."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


class ToolSupportError(UnsupportedError):
    """The model's chat template has no place for tools."""

    param, code = "tools", "tools_unsupported"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: Mapping[str, Any]  # a JSON Schema for the arguments object
    strict: bool | None = None

    def to_openai(self) -> dict:
        fn: dict = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = dict(self.parameters)
        return {"type": "function", "function": fn}


#: the schema of a function declared without parameters (OpenAI: it takes none)
NO_PARAMETERS = {"type": "object", "properties": {}}


def parse_tools(tools: Sequence[Any] | None) -> tuple[Tool, ...]:
    """Validate OpenAI ``tools``; each parameter schema must be a valid JSON Schema."""
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise ToolError("tools must be a list of {\"type\": \"function\", \"function\": {...}}",
                        "tools", "invalid_type")
    # deferred: jsonschema is slow to import; only tool requests need it
    import jsonschema

    out, seen = [], set()
    for i, t in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(t, Mapping) or t.get("type") != "function" \
                or not isinstance(t.get("function"), Mapping):
            raise ToolError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": "
                            "..., \"parameters\": {...}}}}} (function tools are the only kind)",
                            where, "invalid_type")
        fn = t["function"]
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolError(f"{where}.function has unknown field {unknown[0]!r}; a function has "
                            "name, description, parameters and strict", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-' "
                            f"(got {name!r})", f"{where}.function.name")
        if name in seen:
            raise ToolError(f"two tools are named {name!r}; function names must be unique",
                            f"{where}.function.name")
        seen.add(name)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ToolError(f"{where}.function.description must be a string",
                            f"{where}.function.description", "invalid_type")
        params = fn.get("parameters", NO_PARAMETERS)
        where_p = f"{where}.function.parameters"
        if not isinstance(params, Mapping):
            raise ToolError(f"{where_p} must be a JSON Schema object", where_p,
                            "invalid_tool_schema")
        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.exceptions.SchemaError as e:
            at = "/" + "/".join(str(p) for p in e.path) if e.path else "the top level"
            raise ToolError(f"{where_p} of {name!r} is not a valid JSON Schema (at {at}: "
                            f"{e.message})", where_p, "invalid_tool_schema") from None
        if params.get("type", "object") != "object":
            raise ToolError(f"{where_p} of {name!r} must describe an object (\"type\": "
                            "\"object\"): a call's arguments are named", where_p,
                            "invalid_tool_schema")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ToolError(f"{where}.function.strict must be true or false",
                            f"{where}.function.strict", "invalid_type")
        out.append(Tool(name, desc, dict(params), strict))
    return tuple(out)


@dataclass(frozen=True)
class Choice:
    mode: str  # "auto" | "none" | "required" | "named"
    name: str | None = None  # the function, when named

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")


def parse_choice(choice: Any, tools: Sequence[Tool]) -> Choice:
    """OpenAI ``tool_choice`` against the declared tools (default: auto with tools, none
    without, as OpenAI defaults)."""
    if choice is None:
        return Choice("auto" if tools else "none")
    if not tools and choice != "none":
        raise ToolError("tool_choice needs tools; declare the functions the model may call, "
                        "or leave tool_choice out", "tool_choice")
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolError(f"tool_choice {choice!r}; use 'auto', 'none', 'required' or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                            "tool_choice")
        return Choice(choice)
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" \
            or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ToolError("a named tool_choice is {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}", "tool_choice", "invalid_type")
    names = [t.name for t in tools]
    if fn["name"] not in names:
        listed = ", ".join(repr(n) for n in names) or "none"
        raise ToolError(f"tool_choice names the function {fn['name']!r}, which is not among "
                        f"the declared tools ({listed}); declare it in tools or name one of "
                        "them", "tool_choice.function.name", "tool_not_found")
    return Choice("named", fn["name"])


# --- the grammar of a forced call ------------------------------------------------------------
def call_grammar(tools: Sequence[Tool], choice: Choice, fmt: str, parallel: bool) -> str:
    """GBNF for an output that is exactly the forced call(s) in the template's markup.

    The call object is one JSON Schema (each function's name as a ``const`` and its
    parameters as the arguments), converted by llama.cpp's own schema converter
    (edgespec.grammar: a keyword the converter would drop is refused, so every call the
    grammar admits validates); the markup around it is literal. ``parallel`` admits one or
    more calls, else exactly one.
    """
    from ..runtime import backend  # deferred: it loads llama.cpp

    chosen = [t for t in tools if choice.mode == "required" or t.name == choice.name]
    arguments_key = "parameters" if fmt == "llama3" else "arguments"
    alternatives = []
    for t in chosen:
        # bounded before the converter writes it out (edgespec.grammar.bounds: a maxLength of
        # 10**7 is that much grammar text, one of 20000 crashes llama.cpp's parser)
        check_schema(t.parameters)
        try:
            check_schema_supported(t.parameters)
        except (GrammarError, UnsupportedError) as e:
            raise UnsupportedError(f"the parameters of {t.name!r} cannot be enforced for a forced "
                                   f"call: {e}") from None
        alternatives.append({
            "type": "object",
            "properties": {"name": {"const": t.name}, arguments_key: dict(t.parameters)},
            "required": ["name", arguments_key], "additionalProperties": False})
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    try:
        converted = backend.json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter asserts and raises ValueError/KeyError
        raise UnsupportedError(f"the tools' parameter schemas cannot be turned into a grammar "
                               f"({type(e).__name__}: {e}); simplify them") from None
    # the converter's start rule becomes the call object; the markup is the new start
    rules = re.sub(r"^root ::=", "call-object ::=", converted, count=1, flags=re.M)
    if fmt == "hermes":
        one = r'"<tool_call>\n" call-object "\n</tool_call>"'
        root = f"root ::= tool-call ({_q(chr(10))} tool-call)*" if parallel else "root ::= tool-call"
        return f"{root}\ntool-call ::= {one}\n{rules}"
    if fmt == "mistral":
        body = 'call-object ("," space call-object)*' if parallel else "call-object"
        return f'root ::= "[TOOL_CALLS]" "[" {body} "]"\n{rules}'
    return f"root ::= call-object\n{rules}"  # llama3: one JSON object


def _q(text: str) -> str:
    return json.dumps(text)
