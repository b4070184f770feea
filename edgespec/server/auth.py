"""API key check: ``Authorization: Bearer KEY`` (OpenAI's clients, Ollama's with a header) or
``x-api-key: KEY`` (Anthropic's), compared in constant time.

Every route needs the key when one is set, except a minimal liveness check: ``GET /health``
(and llama-server's ``GET /v1/health``)
without the key answers ``{"status": "ok"}`` and nothing else (supervisors and load balancers
probe it without secrets); with the key it answers the full health body (models, queue).

The key comes from ``--api-key``, ``$EDGESPEC_API_KEY`` or ``--api-key-file`` (:func:`read_key_file`),
so that it need not appear in the process table.
"""
from __future__ import annotations

import hmac
import json
import os
import stat
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import InvalidInputError
from ..protocol.errors import ProtocolError
from .errors import APIError
from .guard import answer
from .metrics import ServerMetrics
from .web.routes import PUBLIC_PATHS

#: paths whose minimal answer needs no key (see the module doc)
OPEN_PATHS = frozenset({"/health", "/v1/health"})  # /v1/health: llama-server's spelling
_LIVENESS = json.dumps({"status": "ok"}).encode()


def check(api_key: str | None, path: str, authorization: str | None,
          x_api_key: str | None = None) -> None:
    """Raise a 401 APIError unless the request may pass (``path`` open: always)."""
    if api_key is None or path in OPEN_PATHS:
        return
    if not authorized(api_key, authorization, x_api_key):
        raise APIError(401, _MESSAGE, type="invalid_request_error", code="invalid_api_key")


def authorized(api_key: str, authorization: str | None, x_api_key: str | None = None) -> bool:
    scheme, _, token = (authorization or "").partition(" ")
    # a missing header or another scheme still runs the comparison (against b""), so the
    # time taken does not tell a wrong scheme from a wrong key
    given = token.strip().encode("utf-8") if scheme.lower() == "bearer" else b""
    if x_api_key is not None and not given:
        given = x_api_key.strip().encode("utf-8")
    return hmac.compare_digest(given, api_key.encode("utf-8"))


_MESSAGE = ("missing or invalid API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY') "
            "with the key the server was started with (--api-key, $EDGESPEC_API_KEY or "
            "--api-key-file)")


def read_key_file(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """The key in ``path`` (its first line, surrounding whitespace removed) and a warning when
    other users may read the file (None when they may not)."""
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
        mode = p.stat().st_mode
    except OSError as e:
        raise InvalidInputError(f"--api-key-file {p}: {e.strerror or e}") from None
    try:
        lines = data.decode("utf-8").strip().splitlines()
    except UnicodeDecodeError:
        raise InvalidInputError(f"--api-key-file {p} is not UTF-8 text; put the key on its "
                                "first line") from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise InvalidInputError(f"--api-key-file {p} is empty; put the key on its first line")
    warning = None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warning = (f"warning: {p} can be read by other users; chmod 600 it so that only you "
                   "can read the key")
    return key, warning


class Middleware:
    """Pure ASGI middleware that runs the key check (streaming responses and disconnects
    pass through untouched); a refusal is counted in ``metrics``."""

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: ServerMetrics) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.api_key is not None:
            headers = dict(scope.get("headers") or ())
            ok = authorized(self.api_key, headers.get(b"authorization", b"").decode("latin-1"),
                            _text(headers.get(b"x-api-key")))
            if not ok:
                path = scope.get("path", "")
                if path in OPEN_PATHS and scope.get("method") in ("GET", "HEAD"):
                    await _liveness(send)
                    return
                # the web page's static files (edgespec.server.web) hold no secret, and a
                # browser cannot send a header when it opens a page: they load without the
                # key; the page asks for it and sends it with every API call
                if path in PUBLIC_PATHS and scope.get("method") in ("GET", "HEAD"):
                    await self.app(scope, receive, send)
                    return
                self.metrics.reject(401, "invalid_api_key")
                await answer(scope, send, ProtocolError(401, _MESSAGE, kind="authentication",
                                                        code="invalid_api_key"))
                return
        await self.app(scope, receive, send)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


async def _liveness(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(_LIVENESS)).encode())]})
    await send({"type": "http.response.body", "body": _LIVENESS})
