"""Any failure of a hand-parsed dialect's request (Anthropic Messages, Responses) as one
:class:`~edgespec.protocol.ProtocolError`, counted in the server's metrics, for the
dialect to render in its own error shape."""
from __future__ import annotations

from ...protocol.errors import ProtocolError, from_failure


def to_protocol(e: BaseException) -> ProtocolError:
    """ProtocolErrors (the body reader's APIError is one: 408, 413, bad UTF-8) as they are;
    the engine's errors mapped; bugs logged, a 500."""
    return e if isinstance(e, ProtocolError) else from_failure(e)


def counted(request, e: BaseException) -> ProtocolError:
    """``e`` as a ProtocolError, its refusal counted like every other route's."""
    err = to_protocol(e)
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.reject(err.status, err.code)
    return err
