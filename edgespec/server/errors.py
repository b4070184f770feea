"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the status
OpenAI's clients map to their exception classes (400, 401, 404, 413, 429, 503, 500).

Errors are defined once, in :mod:`edgespec.protocol.errors` (ProtocolError, and the mapping
of the engine's and the scheduler's errors); this module renders them in OpenAI's shape
(llama.cpp's native endpoints use the same shape, as llama-server does) and maps pydantic's
validation errors, so every endpoint answers bad input the same way and the server keeps
serving. :class:`APIError` is a ProtocolError that names its OpenAI ``type`` itself.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..errors import ContextOverflowError, EdgespecError
from ..protocol import errors as protocol
from ..protocol.errors import ProtocolError

log = logging.getLogger("edgespec.server")

#: the neutral kinds as OpenAI's error types
_TYPES = {"invalid_request": "invalid_request_error", "not_found": "invalid_request_error",
          "unsupported": "invalid_request_error", "too_large": "invalid_request_error",
          "context_overflow": "invalid_request_error", "too_complex": "invalid_request_error",
          "timeout": "invalid_request_error", "overloaded": "rate_limit_error",
          "server_error": "server_error", "permission": "permission_error",
          "authentication": "authentication_error"}
_KINDS = {"server_error": "server_error", "rate_limit_error": "overloaded",
          "authentication_error": "authentication", "permission_error": "permission",
          "not_found_error": "not_found"}
_STATUS_KINDS = {404: "not_found", 408: "timeout", 413: "too_large"}


def openai_type(e: ProtocolError) -> str:
    if isinstance(e, APIError):
        return e.type
    if e.status == 503 and e.kind == "overloaded":
        return "server_error"
    return _TYPES.get(e.kind, "invalid_request_error")


def body(e: ProtocolError) -> dict[str, Any]:
    """The OpenAI error body of any ProtocolError."""
    return {"error": {"message": e.message, "type": openai_type(e), "param": e.param,
                      "code": e.code}}


def response(e: ProtocolError) -> JSONResponse:
    return JSONResponse(body(e), status_code=e.status, headers=e.headers)


class APIError(ProtocolError):
    """An error answered to the client as-is, with its OpenAI ``type``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        kind = _KINDS.get(type) or _STATUS_KINDS.get(status, "invalid_request")
        super().__init__(status, message, kind=kind, param=param, code=code, headers=headers)
        self.type = type

    def body(self) -> dict[str, Any]:
        return body(self)

    def response(self) -> JSONResponse:
        return response(self)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value"
                ) -> ProtocolError:
    return protocol.bad_request(message, param, code)


def unsupported(param: str, message: str) -> ProtocolError:
    return protocol.unsupported(param, message)


def context_overflow(kind: str, e: ContextOverflowError) -> ProtocolError:
    """A prompt that does not fit, named by the endpoint's field (``kind`` chat or not)."""
    return protocol.context_overflow(e, "messages" if kind == "chat" else "prompt")


def from_edgespec(e: EdgespecError) -> ProtocolError:
    """The client-facing form of an error the engine or the scheduler raised."""
    return protocol.from_edgespec(e)


def from_validation(errors: Sequence[Mapping[str, Any]]) -> ProtocolError:
    """pydantic's first error, as a sentence naming the field (OpenAI reports one)."""
    if not errors:
        return bad_request("the request body is not valid")
    err = errors[0]
    loc = _field_path(errors)
    param = ".".join(loc) or None
    kind = err.get("type", "")
    if kind == "json_invalid":
        return bad_request(f"the request body is not valid JSON ({err.get('msg')}); send one "
                           "JSON object", code="invalid_json")
    if kind == "extra_forbidden":
        return bad_request(f"unknown field {param!r}: this server (started with --strict) "
                           "refuses fields it does not know rather than ignore them "
                           "(docs/server.md lists the fields)",
                           param=param, code="unknown_parameter")
    if kind == "finite_number":
        value = err.get("input")
        what = "not a number (NaN)" if value != value else f"{value}, not a finite number"
        return bad_request(f"{param}: {what}; send a finite number", param=param,
                           code="invalid_value")
    if kind == "model_type" and not loc:
        return bad_request("the request body must be a JSON object", code="invalid_type")
    where = f"{param}: " if param else ""
    return bad_request(f"{where}{err.get('msg')}", param=param,
                       code="invalid_type" if kind.endswith("_type") else "invalid_value")


def _field_path(errors: Sequence[Mapping[str, Any]]) -> list[str]:
    """The path of the field the first error is about. A value that fits no member of a
    union gets one error per member, each with the member's name appended to the path
    (``stop.str``, ``stop.list[str]``); their common prefix is the field itself."""
    locs = [[str(p) for p in e.get("loc", ()) if p != "body"] for e in errors]
    first = locs[0]
    same_field = [l for l in locs if l[:1] == first[:1]]
    if len(same_field) < 2:
        return first
    n = 0
    while all(len(l) > n and l[n] == first[n] for l in same_field):
        n += 1
    return first[:n]


def install_handlers(app: FastAPI, on_error: Callable[[int, str | None], None] = (
        lambda status, code: None)) -> None:
    """Answer every failure OpenAI-shaped; ``on_error(status, code)`` counts it."""

    def answer(e: ProtocolError) -> JSONResponse:
        on_error(e.status, e.code)
        return response(e)

    @app.exception_handler(ProtocolError)
    async def _api(request: Request, e: ProtocolError) -> Response:
        return answer(e)

    @app.exception_handler(EdgespecError)
    async def _edgespec(request: Request, e: EdgespecError) -> Response:
        return answer(from_edgespec(e))

    @app.exception_handler(ValidationError)
    async def _pydantic(request: Request, e: ValidationError) -> Response:
        return answer(from_validation(e.errors()))

    @app.exception_handler(RequestValidationError)
    async def _fastapi(request: Request, e: RequestValidationError) -> Response:
        return answer(from_validation(list(e.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> Response:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = (f"no route {request.method} {request.url.path}; see GET /v1/models and "
                   "docs/server.md" if e.status_code in (404, 405) else str(e.detail))
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return answer(APIError(e.status_code, message, type=kind, code=code))

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> Response:
        log.exception("unhandled error serving %s", request.url.path)
        return answer(APIError(500, f"internal error ({type(e).__name__}); the server keeps "
                                    "serving, please report this with the server log",
                               type="server_error", code="internal_error"))
