"""What a web page must not do with a local server: the Host, Origin and Content-Type checks.

A server on 127.0.0.1 is reachable from every web page the user opens. Two ways in, and the
check that closes each:

- DNS rebinding: a page on ``attacker.example`` makes that name resolve to 127.0.0.1 and
  reads the answers as same-origin. The browser still sends ``Host: attacker.example``, so
  the ``Host`` header must name an address the server listens on, ``localhost``, a loopback
  literal, or a name allowed with ``--allow-host`` (403 ``host_not_allowed``).
- Cross-origin "simple" requests: a page may POST ``text/plain`` or a form to any address
  without a CORS preflight; the browser hides the answer, but the generation runs. Every
  browser request from a page carries ``Origin``: one that is neither the server's own
  origin nor allowed with ``--cors-origin`` is refused before the app sees it (403
  ``origin_not_allowed``), preflight or not. And a body must be JSON: a ``Content-Type``
  other than ``application/json`` (or ``*+json``) is 415 ``unsupported_media_type``. A
  request without ``Content-Type`` passes (http.client and scripts send none; a page that
  sends none still sends ``Origin``).

:class:`Middleware` is pure ASGI around the whole app, so every route, every dialect's
included, passes the same checks; refusals are rendered in the dialect's error shape
(:func:`refusal`).
"""
from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from ..protocol.errors import ProtocolError

#: names every loopback server answers to, whatever it was bound to
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})


@dataclass(frozen=True)
class HostPolicy:
    """The ``Host`` names a server answers to (lowercase, without port or brackets).

    ``names`` exact names; a name starting with ``.`` allows that domain and every name
    under it; ``*`` allows any. ``any_ip``: an IP literal passes (a server bound to every
    interface answers on each address it has; an IP literal cannot be rebound)."""

    names: frozenset[str]
    any_ip: bool = False

    @classmethod
    def for_bind(cls, bind_hosts: Iterable[str], allowed: Iterable[str] = ()) -> "HostPolicy":
        binds = [normal_host(h) for h in bind_hosts]
        names = {*LOCAL_NAMES, *(b for b in binds if b not in _WILDCARD_BINDS),
                 *(normal_host(a) if a not in ("*",) and not a.startswith(".") else a.lower()
                   for a in allowed)}
        return cls(frozenset(names), any_ip=any(b in _WILDCARD_BINDS for b in binds))

    def allows(self, host: str) -> bool:
        if "*" in self.names or host in self.names:
            return True
        if any(n.startswith(".") and (host == n[1:] or host.endswith(n)) for n in self.names):
            return True
        return self.any_ip and _is_ip(host)


def normal_host(value: str) -> str:
    """``Host`` header (or bind address) -> the bare lowercase name: port, IPv6 brackets and
    a trailing dot removed (``[::1]:8080`` -> ``::1``, ``LocalHost.:80`` -> ``localhost``)."""
    v = value.strip().lower()
    if v.startswith("["):
        v = v[1:v.index("]")] if "]" in v else v[1:]
    elif v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_origin(origin: str, host: str | None, scheme: str, allowed: tuple[str, ...]) -> bool:
    """Whether a request with this ``Origin`` may reach the app: the server's own origin
    (its scheme and ``Host``: the web page it serves), or one ``--cors-origin`` allows."""
    if "*" in allowed or origin in allowed or origin.rstrip("/") in allowed:
        return True
    if origin == "null" or host is None:
        return False
    parts = urlsplit(origin)
    return parts.scheme == scheme and parts.netloc.lower() == host.strip().lower()


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                          and media.endswith("+json"))


def refusal(path: str, err: ProtocolError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) of an error in the shape of the dialect ``path`` belongs to:
    Ollama's ``{"error": "..."}`` under ``/api/``, Anthropic's under ``/v1/messages``,
    OpenAI's elsewhere (llama.cpp's native routes use OpenAI's, as llama-server does)."""
    if path.startswith("/api/"):
        body: dict[str, Any] = {"error": err.message}
    elif path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(err.kind, "api_error"),
                                           "message": err.message}}
    else:
        body = {"error": {"message": err.message, "type": _OPENAI_TYPES.get(
            err.kind, "invalid_request_error"), "param": err.param, "code": err.code}}
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(data)).encode()),
               *((k.lower().encode("latin-1"), v.encode("latin-1"))
                 for k, v in err.headers.items())]
    return err.status, headers, data


_OPENAI_TYPES = {"authentication": "invalid_request_error", "permission": "permission_error",
                 "not_found": "not_found_error", "server_error": "server_error",
                 "overloaded": "rate_limit_error"}
_ANTHROPIC_TYPES = {"invalid_request": "invalid_request_error", "unsupported":
                    "invalid_request_error", "authentication": "authentication_error",
                    "permission": "permission_error", "not_found": "not_found_error",
                    "too_large": "request_too_large", "overloaded": "overloaded_error",
                    "timeout": "invalid_request_error"}


async def answer(scope: Scope, send: Send, err: ProtocolError) -> None:
    """Send ``err`` as the whole response, in the shape of the route's dialect."""
    status, headers, body = refusal(scope.get("path", ""), err)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Middleware:
    """Pure ASGI: Host, then Origin, then Content-Type (module doc); a refusal is counted
    with ``on_refusal(status, code)``. ``hosts`` None skips the Host check (an app built
    in-process, e.g. under a test client; ``edgespec serve`` always sets it)."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy | None, cors_origins: tuple[str, ...] = (),
                 on_refusal: Callable[[int, str | None], None] = lambda status, code: None
                 ) -> None:
        self.app = app
        self.hosts = hosts
        self.cors_origins = tuple(cors_origins)
        self.on_refusal = on_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            err = self.check(scope)
            if err is not None:
                self.on_refusal(err.status, err.code)
                await answer(scope, send, err)
                return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> ProtocolError | None:
        headers = _headers(scope)
        host = headers.get(b"host")
        host_text = host.decode("latin-1") if host is not None else None
        if self.hosts is not None and host_text is not None \
                and not self.hosts.allows(normal_host(host_text)):
            return ProtocolError(
                403, f"this server does not answer to the host name {host_text[:100]!r} (a "
                     "web page on another name may be rebinding it to this machine); use "
                     "http://127.0.0.1 or http://localhost, or start the server with "
                     "--allow-host NAME", kind="permission", code="host_not_allowed")
        origin = headers.get(b"origin")
        # a preflight (OPTIONS) is CORS's to answer: it runs nothing and tells the browser
        # what the real request may do
        if origin is not None and scope.get("method") != "OPTIONS":
            text = origin.decode("latin-1")
            if not check_origin(text, host_text, scope.get("scheme", "http"),
                                self.cors_origins):
                return ProtocolError(
                    403, f"requests from the web page origin {text[:100]!r} are refused; "
                         "start the server with --cors-origin "
                         f"{text[:100] if text != 'null' else 'ORIGIN'} to allow it",
                    kind="permission", code="origin_not_allowed")
        kind = headers.get(b"content-type")
        if kind is not None and scope.get("method", "").encode() in _BODY_METHODS \
                and not is_json(kind.decode("latin-1")):
            return ProtocolError(
                415, f"the request body must be JSON sent as Content-Type: application/json "
                     f"(got {kind.decode('latin-1')[:80]!r}; curl: -H 'Content-Type: "
                     "application/json')", kind="invalid_request",
                code="unsupported_media_type")
        return None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The first value of each header (names are lowercase in ASGI)."""
    out: dict[bytes, bytes] = {}
    for k, v in scope.get("headers") or ():
        out.setdefault(k, v)
    return out
