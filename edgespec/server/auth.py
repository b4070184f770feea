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
