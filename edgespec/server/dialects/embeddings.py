"""Embeddings from the served models: OpenAI's ``POST /v1/embeddings`` (and
``/embeddings``), Ollama's ``POST /api/embed`` and its legacy ``POST /api/embeddings``.

Every route embeds through :mod:`edgespec.engine.embedding`: a second llama.cpp context of
the loaded model, beside the generation context, so an embedding never waits for a
generation step nor disturbs a request's KV. Pooling is llama.cpp's (mean, cls, last, or
the GGUF's own: ``model``, the default, which is mean for a generative model); a request
may name one in ``pooling`` (an edgespec extension field).

- ``/v1/embeddings``: ``input`` a string, a list of strings, a list of token ids or a list
  of those; ``encoding_format`` ``float`` or ``base64`` (little-endian float32, as OpenAI's
  clients decode it); ``dimensions`` only the model's own; vectors unit length (as
  llama-server and OpenAI return them); an input longer than the embedding context is a
  400 ``context_length_exceeded``. Errors OpenAI-shaped.
- ``/api/embed``: ``{"model", "input": str | [str], "truncate": true}`` ->
  ``{"model", "embeddings": [[...]], "total_duration", "load_duration",
  "prompt_eval_count"}`` (nanoseconds, unit vectors, as Ollama answers).
- ``/api/embeddings``: ``{"model", "prompt"}`` -> ``{"embedding": [...]}`` (not
  normalised, as Ollama's legacy route). Errors ``{"error": "..."}``.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from ...errors import ContextOverflowError, EdgespecError
from ...protocol.errors import ProtocolError, bad_request, context_overflow, from_edgespec, \
    unsupported
from ...protocol.core import Core
from ...runtime.embedding import POOLING_NAMES
from .. import body as wire_body
from ..settings import ServerSettings
from .refusal import counted

if TYPE_CHECKING:
    from ...engine.embedding import Embeddings
    from ...engine.engine import Engine

OPENAI_ROUTES = ("/v1/embeddings", "/embeddings")
#: inputs one request may hold (OpenAI's own limit)
MAX_INPUTS = 2048
#: poolings a request may ask for (pooling "none", one vector per token, is not an
#: OpenAI or Ollama shape; llama-server refuses it on /v1/embeddings too)
REQUEST_POOLINGS = tuple(p for p in POOLING_NAMES if p != "none")


def register(app: FastAPI, core: Core, settings: ServerSettings) -> None:
    """Add the embedding routes to ``app`` over ``core`` (an edgespec.protocol.Core)."""

    async def openai(request: Request) -> Response:
        try:
            req = parse_openai(await _json(request, settings))
            async with core.held(req["model"]) as held:
                out = await asyncio.to_thread(
                    _embed, held.engine, req["inputs"], req["pooling"], True, False)
                return JSONResponse(render_openai(out, req["model"] or held.name,
                                                  req["encoding_format"], req["dimensions"]))
        except EdgespecError as e:
            raise _protocol(e, "input") from None

    for path in OPENAI_ROUTES:
        app.add_api_route(path, openai, methods=["POST"])

    @app.post("/api/embed")
    async def ollama_embed(request: Request) -> Response:
        return await _ollama(request, core, settings, legacy=False)

    @app.post("/api/embeddings")
    async def ollama_embeddings(request: Request) -> Response:
        return await _ollama(request, core, settings, legacy=True)


# --- OpenAI ---------------------------------------------------------------------------------
def parse_openai(body: Any) -> dict[str, Any]:
    """The request's fields, checked: model, inputs (strings or token-id lists), pooling,
    encoding_format, dimensions."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", param="model", code="invalid_type")
    if "input" not in body:
        raise bad_request("input is required: a string, a list of strings or token ids",
                          param="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise bad_request(f"encoding_format {fmt!r} is not float or base64",
                          param="encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise bad_request("dimensions must be a positive integer", param="dimensions",
                          code="invalid_type")
    return {"model": model or None, "inputs": openai_inputs(body["input"]),
            "pooling": _pooling(body.get("pooling")), "encoding_format": fmt,
            "dimensions": dims}


def openai_inputs(value: Any) -> list[str | list[int]]:
    """OpenAI's ``input``: a string, a list of strings, a list of token ids (one input), or
    a list of token-id lists."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise bad_request("input must be a non-empty string or list (strings or token ids)",
                          param="input", code="invalid_type")
    if all(_is_id(t) for t in value):
        return [list(value)]
    if len(value) > MAX_INPUTS:
        raise bad_request(f"{len(value)} inputs in one request; at most {MAX_INPUTS}",
                          param="input")
    out: list[str | list[int]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list) and item and all(_is_id(t) for t in item):
            out.append(list(item))
        else:
            raise bad_request(f"input[{i}] must be a string or a non-empty list of token ids",
                              param="input", code="invalid_type")
    return out


def render_openai(out: Embeddings, model: str, encoding_format: str = "float",
                  dimensions: int | None = None) -> dict[str, Any]:
    """OpenAI's embedding list for an :class:`edgespec.engine.embedding.Embeddings`."""
    n_embd = out.vectors[0].shape[-1] if out.vectors else 0
    if dimensions is not None and dimensions != n_embd:
        raise unsupported("dimensions", f"this model's embeddings have {n_embd} dimensions; "
                                        f"shortening them to {dimensions} is not supported "
                                        "(leave dimensions out)")
    data = [{"object": "embedding", "index": i,
             "embedding": (base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
                           if encoding_format == "base64" else v.tolist())}
            for i, v in enumerate(out.vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": out.n_tokens, "total_tokens": out.n_tokens}}


# --- Ollama ---------------------------------------------------------------------------------
async def _ollama(request: Request, core: Core, settings: ServerSettings, legacy: bool) -> Response:
    from .ollama import resolve  # Ollama's model names (name:latest is name)

    t0 = time.perf_counter()
    try:
        body = await _json(request, settings)
        req = parse_ollama(body, legacy)
        name = resolve(core, req["model"])
        async with core.held(name) as held:
            loaded = time.perf_counter()
            out = await asyncio.to_thread(_embed, held.engine, req["inputs"], req["pooling"],
                                          not legacy, req["truncate"])
        if legacy:
            return JSONResponse({"embedding": out.vectors[0].tolist()})
        return JSONResponse({"model": req["model"],
                             "embeddings": [v.tolist() for v in out.vectors],
                             "total_duration": int((time.perf_counter() - t0) * 1e9),
                             "load_duration": int((loaded - t0) * 1e9),
                             "prompt_eval_count": out.n_tokens})
    except Exception as e:
        err = counted(request, _protocol(e, "prompt" if legacy else "input"))
        return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


def parse_ollama(body: Any, legacy: bool) -> dict[str, Any]:
    """``/api/embed``'s ``{"model", "input", "truncate"}`` or ``/api/embeddings``'
    ``{"model", "prompt"}``."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name of a model (GET /api/tags lists them)",
                          param="model")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise bad_request("truncate must be true or false", param="truncate")
    field = "prompt" if legacy else "input"
    value = body.get(field)
    if isinstance(value, str) and (value or not legacy):
        inputs: list[str | list[int]] = [value]
    elif not legacy and isinstance(value, list) and value and all(
            isinstance(v, str) for v in value):
        if len(value) > MAX_INPUTS:
            raise bad_request(f"{len(value)} inputs in one request; at most {MAX_INPUTS}",
                              param="input")
        inputs = list(value)
    else:
        want = "a non-empty string" if legacy else "a string or a non-empty list of strings"
        raise bad_request(f"{field} must be {want}", param=field)
    if any(isinstance(x, str) and not x for x in inputs):
        raise bad_request(f"{field} holds an empty string; embed non-empty text", param=field)
    options = body.get("options")
    pooling = options.get("pooling") if isinstance(options, dict) else None
    return {"model": model, "inputs": inputs, "truncate": truncate,
            "pooling": _pooling(pooling if pooling is not None else body.get("pooling"))}


# --- shared ---------------------------------------------------------------------------------
def _embed(engine: Engine, inputs: list[Any], pooling: str, normalize: bool,
           truncate: bool) -> Embeddings:
    from ...engine.embedding import embedder  # the engine's embedding context, opened once

    return embedder(engine, pooling).embed(inputs, normalize=normalize, truncate=truncate)


def _pooling(value: Any) -> str:
    if value is None:
        return "model"
    if value not in REQUEST_POOLINGS:
        raise bad_request(f"pooling {value!r} is not one of {', '.join(REQUEST_POOLINGS)}",
                          param="pooling")
    return str(value)


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


async def _json(request: Request, settings: ServerSettings) -> Any:
    text = await wire_body.read(request, settings)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep to parse
        raise bad_request(f"the request body is not valid JSON ({e}); send one JSON object",
                          code="invalid_json") from None


def _protocol(e: BaseException, param: str) -> BaseException:
    """The engine's refusals as ProtocolErrors naming the input field."""
    if isinstance(e, ProtocolError):
        return e
    if isinstance(e, ContextOverflowError):
        return context_overflow(e, param)
    if isinstance(e, EdgespecError):
        err = from_edgespec(e, param)
        if err.param is None and err.status == 400:
            err.param = param
        return err
    return e


__all__ = ["OPENAI_ROUTES", "openai_inputs", "parse_ollama", "parse_openai", "register",
           "render_openai"]
