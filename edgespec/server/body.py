"""A request's body: read within the server's limits (size, time, UTF-8) and parsed
strictly (schemas), unknown fields dropped and named in one log line."""
from __future__ import annotations

import asyncio
import logging

from fastapi import Request

from .errors import APIError
from .schemas import R, parse_request
from .settings import ServerSettings

log = logging.getLogger("edgespec.server")

#: an oversized body is read and dropped up to this size before the 413 (see _read_body)
_DISCARD_BYTES = 16 * 1024 * 1024


#: a body at least this long is parsed on a worker thread: JSON and schema validation of a
#: large body (1,500 tools are ~600 KiB) would stall every stream and /health on the loop
OFF_LOOP_BYTES = 64 * 1024


async def parsed(model: type[R], request: Request, settings: ServerSettings) -> R:
    """The validated request of schema ``model``, read from ``request``."""
    text = await read(request, settings)
    if len(text) >= OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse, model, text, settings, request)
    return parse(model, text, settings, request)


def parse(model: type[R], body: str, settings: ServerSettings, request: Request) -> R:
    """The validated request; unknown fields are dropped and named in one log line (or,
    with --strict, refused by parse_request)."""
    req, ignored = parse_request(model, body, strict=settings.strict)
    if ignored:
        log.warning("%s: ignored unknown request fields: %s (edgespec serve --strict refuses "
                    "them)", request.url.path, ", ".join(ignored))
    return req


async def read(request: Request, settings: ServerSettings) -> str:
    """The request body as text: at most settings.max_body_bytes, valid UTF-8, complete
    within settings.read_timeout (a client that stops sending gets a 408 and is closed)."""
    try:
        return await asyncio.wait_for(_read_body(request, settings), settings.read_timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {settings.read_timeout:g} "
                            "s (the server's --timeout-read); send it at once",
                       code="request_timeout", headers={"Connection": "close"}) from None


async def _read_body(request: Request, settings: ServerSettings) -> str:
    limit = settings.max_body_bytes
    too_big = APIError(413, f"the request body exceeds {limit} bytes; send a shorter prompt",
                       code="request_too_large")
    length = request.headers.get("content-length", "")
    declared = int(length) if length.isdigit() else None
    if declared is not None and declared > _DISCARD_BYTES:
        raise too_big
    chunks, size = [], 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            # read the rest without keeping it, so the client (still sending) sees the 413
            # instead of a reset connection
            async for rest in stream:
                size += len(rest)
                if size > _DISCARD_BYTES:
                    break
            raise too_big
        chunks.append(chunk)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 (byte 0x{data[e.start]:02x} "
                            f"at offset {e.start}); send UTF-8 encoded JSON",
                       code="invalid_encoding") from None
