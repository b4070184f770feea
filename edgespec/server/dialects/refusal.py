"""Any failure of a hand-parsed dialect's request (Anthropic Messages, Responses, llama-server's
and Ollama's native routes) as one :class:`~edgespec.protocol.ProtocolError`, counted in the
server's metrics, for the dialect to render in its own error shape; :func:`refusing` wraps a
route handler so."""
from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from ...protocol.errors import ProtocolError, from_failure


def to_protocol(e: BaseException) -> ProtocolError:
    """ProtocolErrors (the body reader's APIError is one: 408, 413, bad UTF-8) as they are;
    the engine's errors mapped; bugs logged, a 500."""
    return e if isinstance(e, ProtocolError) else from_failure(e)


def counted(request: Request, e: BaseException) -> ProtocolError:
    """``e`` as a ProtocolError, its refusal counted like every other route's."""
    err = to_protocol(e)
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.reject(err.status, err.code)
    return err


#: a route handler: the request first, FastAPI's other parameters after it
Handler = Callable[..., Awaitable[Response]]


def refusing(render: Callable[[Request, BaseException], Response]) -> Callable[[Handler], Handler]:
    """A route handler whose failure is answered by ``render``, the dialect's error shape
    (each dialect's routes would otherwise repeat the same try/except). What fails later,
    inside a streamed body, is the stream's to report."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)  # FastAPI reads the handler's signature through __wrapped__
        async def route(request: Request, *args: Any, **kwargs: Any) -> Response:
            try:
                return await handler(request, *args, **kwargs)
            except Exception as e:
                return render(request, e)

        return route

    return wrap
