"""The routes: ``GET /`` (the page), ``GET /web/{asset}`` (its script, styles, icon; the
icon also as ``/favicon.ico``) and ``GET /v1/edgespec/status`` (status.py; served with or
without the page).

The assets are read once from package data at registration; only the names in ``ASSETS``
are served (no path reaches the file system). Every page response carries a
Content-Security-Policy that allows the page's own origin and nothing else: no inline
script, no external asset, no connection elsewhere, no framing.
"""
from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from ...serving import ModelPool
from ..errors import APIError
from ..settings import ServerSettings
from .status import status

#: served file name -> content type
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PAGE = "index.html"
#: what a browser fetches to show the page: the key check lets these through (auth.py)
PUBLIC_PATHS = frozenset({"/", "/favicon.ico", *(f"/web/{name}" for name in ASSETS)})

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")

#: the page is small and versioned with the server: always revalidated, never stale after
#: an upgrade; nosniff so a script is only ever run as the type we send
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def register(app: FastAPI, pool: ModelPool, settings: ServerSettings) -> None:
    """The status route always; the page and its assets unless ``settings.web`` is off
    (``edgespec serve --no-web``)."""

    @app.get("/v1/edgespec/status", include_in_schema=False)
    async def edgespec_status() -> Response:
        return JSONResponse(status(pool, settings))

    if not settings.web:
        return
    files = load_assets()

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return Response(files[PAGE], media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:  # what browsers ask for by default, beside the page's own link
        return Response(files["favicon.svg"], media_type=ASSETS["favicon.svg"], headers=HEADERS)

    @app.get("/web/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise APIError(404, f"no web asset {name!r}", code="not_found")
        return Response(files[name], media_type=ASSETS[name], headers=HEADERS)


def load_assets() -> dict[str, bytes]:
    """The page and its assets, from package data (a missing one is a broken install)."""
    root = resources.files(__package__) / "static"
    return {name: (root / name).read_bytes() for name in (PAGE, *ASSETS)}
