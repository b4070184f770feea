"""OpenAI completions: ``POST /v1/completions`` (and ``/completions``), over the protocol
core.

``prompt`` is a string, a list of token ids, or a list of either: a list of prompts is
one request whose choices are numbered prompt by prompt (``n`` each), as OpenAI answers
it. ``echo`` starts each answer with its prompt's text; ``suffix`` makes the request a
fill-in-the-middle one with the model's FIM tokens (refused, naming the model, when it has
none).
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from ...api.params import GenerationParams
from ...protocol import limits
from ...protocol.core import Core
from ...protocol.errors import bad_request, unsupported
from ...protocol.request import CoreRequest, Fim
from ..schemas import CompletionRequest
from ..settings import ServerSettings
from .openai_common import answer, common_sampling, refuse_common

ROUTES = ("/v1/completions", "/completions")
#: prompts one request may hold (each runs as its own choices)
MAX_PROMPTS = 16


def register(app: FastAPI, core: Core, settings: ServerSettings) -> None:
    async def completions(request: Request) -> Response:
        return await answer(request, core, settings, CompletionRequest, "completion",
                            lambda req, n_vocab: parse(req, settings, n_vocab))

    for path in ROUTES:
        app.add_api_route(path, completions, methods=["POST"])


def prompts(prompt: Any) -> list[str | tuple[int, ...]]:
    """The request's prompts: text or token ids, one or a list."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("the prompt is empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [tuple(prompt)]
    return [p if isinstance(p, str) else tuple(p) for p in prompt]


def parse(req: CompletionRequest, settings: ServerSettings, n_vocab: int) -> list[CoreRequest]:
    refuse_common(req)
    if req.best_of not in (None, 1, req.n):
        raise unsupported("best_of", "best_of > n is not supported (the server returns every "
                                     "choice it generates); send n instead")
    found = prompts(req.prompt)
    if len(found) > MAX_PROMPTS:
        raise bad_request(f"{len(found)} prompts in one request; at most {MAX_PROMPTS}",
                          param="prompt")
    if req.suffix is not None and (req.echo or any(not isinstance(p, str) for p in found)):
        raise bad_request("suffix (fill-in-the-middle) takes text prompts without echo",
                          param="suffix")
    params = GenerationParams(
        max_tokens=limits.max_tokens(req.max_tokens, settings.max_tokens_limit),
        stop=limits.stops(req.stop), chat=False, logprobs=req.logprobs,
        sampling=common_sampling(req, settings, n_vocab))
    out = []
    for p in found:
        if req.suffix is not None:
            assert isinstance(p, str)
            out.append(CoreRequest(model=req.model, params=params, fim=Fim(p, req.suffix),
                                   n=req.n or 1, param_prompt="prompt"))
        else:
            out.append(CoreRequest(model=req.model, params=params, prompt=p, n=req.n or 1,
                                   echo=req.echo, param_prompt="prompt"))
    return out
