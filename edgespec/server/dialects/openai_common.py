"""What OpenAI's chat and completions routes share: the sampling fields, the refusals
common to both, and the answer (whole JSON or an SSE stream) rendered from core events."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable, TypeVar

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...api.params import SamplingParams
from ...protocol import limits
from ...protocol.core import Core, Running
from ...protocol.errors import ProtocolError, bad_request
from ...protocol.events import ChoiceDone
from ...protocol.request import CoreRequest
from .. import body
from ..errors import body as error_body
from ..responses import Shape
from ..schemas import CommonRequest
from ..settings import ServerSettings

#: the request schema of a route (chat or completions)
Req = TypeVar("Req", bound=CommonRequest)


def refuse_common(req: CommonRequest) -> None:
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream: true",
                          param="stream_options")


def common_sampling(req: CommonRequest, settings: ServerSettings, n_vocab: int
                    ) -> SamplingParams:
    return limits.sampling(
        temperature=req.temperature, default_temperature=settings.default_temperature,
        top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, repeat_penalty=req.repeat_penalty,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        bias=limits.logit_bias(req.logit_bias, n_vocab), seed=req.seed)


async def answer(request: Request, core: Core, settings: ServerSettings, schema: type[Req],
                 kind: str, parse: Callable[[Req, int], list[CoreRequest]]) -> Response:
    """Read ``request`` as ``schema``, parse it into core requests (with the model's
    vocabulary size), run them and answer whole or streamed."""
    req = await body.parsed(schema, request, settings)
    async with core.held(req.model) as held:
        creqs = parse(req, held.engine.target.n_vocab)
    run = await core.start_all(request, creqs)
    engine = run.engine
    identity = engine.identity
    include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    shape = Shape(kind, run.model, identity.short, engine.target.token_piece,
                  identity=identity.hash, include_usage=include_usage)
    if req.stream:
        return EventSourceResponse(stream(run, shape), sep="\n", ping=15)
    dones = await run.collect()
    return JSONResponse(shape.whole(dones, {r.index: r.prefix for r in run.readers}))


async def stream(run: Running, shape: Shape) -> AsyncIterator[str]:
    """The SSE data of a request's choices; an error after the stream began is its last
    event (OpenAI-shaped, no [DONE])."""
    events = run.__aiter__()
    dones: list[ChoiceDone] = []
    try:
        if shape.kind == "chat":
            for i in range(run.n):
                yield json.dumps(shape.first(i))
        async for ev in events:
            if isinstance(ev, ChoiceDone):
                dones.append(ev)
            for chunk in shape.event(ev):
                yield json.dumps(chunk)
        if shape.include_usage and dones:
            yield json.dumps(shape.usage_chunk(sorted(dones, key=lambda d: d.index)))
        yield "[DONE]"
    except ProtocolError as e:
        yield json.dumps(error_body(e))
    finally:
        await events.aclose()  # the client went away: every choice is cancelled
