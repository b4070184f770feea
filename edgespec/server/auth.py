"""API key check: ``Authorization: Bearer KEY``, compared in constant time.

/health stays open (load balancers and supervisors probe it without secrets); every other
route needs the key when one is set.
"""
from __future__ import annotations

import hmac

from .errors import APIError

OPEN_PATHS = frozenset({"/health"})


def check(api_key: str | None, path: str, authorization: str | None) -> None:
    """Raise a 401 APIError unless the request may pass."""
    if api_key is None or path in OPEN_PATHS:
        return
    scheme, _, token = (authorization or "").partition(" ")
    # a missing header or another scheme still runs the comparison (against b""), so the
    # time taken does not tell a wrong scheme from a wrong key
    given = token.strip().encode("utf-8") if scheme.lower() == "bearer" else b""
    if not hmac.compare_digest(given, api_key.encode("utf-8")):
        raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer KEY' with "
                            "the key the server was started with (--api-key)",
                       type="invalid_request_error", code="invalid_api_key")


class Middleware:
    """Pure ASGI middleware that runs :func:`check` (streaming responses and disconnects
    pass through untouched); a refusal is counted in ``metrics``."""

    def __init__(self, app, api_key: str | None, metrics) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.api_key is not None:
            header = dict(scope.get("headers") or ()).get(b"authorization", b"")
            try:
                check(self.api_key, scope.get("path", ""), header.decode("latin-1"))
            except APIError as e:
                self.metrics.reject(e.status, e.code)
                await e.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
