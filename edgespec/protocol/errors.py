"""Errors defined once, rendered by each dialect in its own shape.

A :class:`ProtocolError` carries what every wire format needs: the HTTP status, a message
that says what to do, a dialect-neutral ``kind``, the field it is about (``param``) and a
machine-readable ``code``. OpenAI renders ``{"error": {...}}``, Anthropic
``{"type": "error", "error": {...}}``, Ollama ``{"error": "..."}``; the mapping from the
engine's and the scheduler's own errors (:func:`from_edgespec`) lives here, so that every
dialect refuses the same input with the same status and code.
"""
from __future__ import annotations

import logging
import math

from ..errors import ContextOverflowError, EdgespecError, UnsupportedError
from ..serving.tickets import QueueFullError, ShuttingDownError

log = logging.getLogger("edgespec.protocol")

#: the dialect-neutral kinds; each dialect maps them onto its own error types
KINDS = frozenset({"invalid_request", "not_found", "unsupported", "too_large", "overloaded",
                   "context_overflow", "too_complex", "server_error", "permission",
                   "authentication", "timeout"})


class ProtocolError(Exception):
    """An error answered to the client, in the shape of the dialect it asked in."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return (f"ProtocolError({self.status}, {self.message!r}, kind={self.kind!r}, "
                f"param={self.param!r}, code={self.code!r})")


def bad_request(message: str, param: str | None = None, code: str = "invalid_value"
                ) -> ProtocolError:
    return ProtocolError(400, message, param=param, code=code)


def unsupported(param: str | None, message: str) -> ProtocolError:
    return ProtocolError(400, message, kind="unsupported", param=param,
                         code="unsupported_parameter")


def not_found(message: str, param: str | None = "model", code: str = "model_not_found"
              ) -> ProtocolError:
    return ProtocolError(404, message, kind="not_found", param=param, code=code)


def context_overflow(e: ContextOverflowError, param: str | None = "messages") -> ProtocolError:
    """A prompt that does not fit, named by the dialect's field (``messages``, ``prompt``)."""
    return ProtocolError(400, str(e), kind="context_overflow", param=param,
                         code="context_length_exceeded")


def internal(exc: BaseException) -> ProtocolError:
    """A bug's client-facing form: the server keeps serving, the log has the traceback."""
    return ProtocolError(500, f"internal error ({type(exc).__name__}); the server keeps "
                              "serving, please report this with the server log",
                         kind="server_error", code="internal_error")


def from_edgespec(e: EdgespecError, param: str | None = None) -> ProtocolError:
    """The client-facing form of an error the engine, the agents or the scheduler raised;
    ``param`` names the prompt's field for a context overflow (default ``messages``)."""
    if isinstance(e, QueueFullError):
        retry = max(1, math.ceil(e.retry_after))
        return ProtocolError(429, str(e), kind="overloaded", code="queue_full",
                             headers={"Retry-After": str(retry)})
    if isinstance(e, ShuttingDownError):
        return ProtocolError(503, str(e), kind="server_error", code="shutting_down")
    if isinstance(e, ContextOverflowError):
        return context_overflow(e, param or "messages")
    code, where = getattr(e, "code", None), getattr(e, "param", None)
    if code and where:  # edgespec.agents' errors name their field and code
        kind = "unsupported" if isinstance(e, UnsupportedError) else "invalid_request"
        return ProtocolError(400, str(e), kind=kind, param=where, code=code)
    if isinstance(e, UnsupportedError):
        return ProtocolError(400, str(e), kind="unsupported", code="unsupported_parameter")
    return ProtocolError(400, str(e), code="invalid_value")  # InvalidInputError, ModelError...


def from_failure(exc: BaseException, param: str | None = None) -> ProtocolError:
    """The client-facing form of anything that reached a request from the scheduler thread."""
    if isinstance(exc, ProtocolError):
        return exc
    if isinstance(exc, EdgespecError):
        return from_edgespec(exc, param)
    log.error("request failed on the scheduler thread", exc_info=exc)
    return internal(exc)
