"""Any failure of a hand-parsed dialect's request (Anthropic Messages, Responses) as one
:class:`~edgespec.protocol.ProtocolError`, counted in the server's metrics, for the
dialect to render in its own error shape."""
from __future__ import annotations

from ...protocol.errors import ProtocolError, from_failure
from ..errors import APIError


def to_protocol(e: BaseException) -> ProtocolError:
    """The server's own APIError (the body reader's: 408, 413, bad UTF-8), the engine's
    errors, and bugs (logged, a 500)."""
    if isinstance(e, ProtocolError):
        return e
    if isinstance(e, APIError):
        kind = "server_error" if e.status >= 500 else "not_found" if e.status == 404 \
            else "too_large" if e.status == 413 else "timeout" if e.status == 408 \
            else "invalid_request"
        return ProtocolError(e.status, e.message, kind=kind, param=e.param, code=e.code,
                             headers=e.headers)
    return from_failure(e)


def counted(request, e: BaseException) -> ProtocolError:
    """``e`` as a ProtocolError, its refusal counted like every other route's."""
    err = to_protocol(e)
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.reject(err.status, err.code)
    return err
