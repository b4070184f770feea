"""``n > 1``: several choices of one request, generated as parallel sequences that share
the prompt's KV (:meth:`edgespec.serving.Scheduler.submit_n`: prefilled once, copied with
seq_cp), answered as OpenAI does: ``choices[i]`` with ``index`` i, stream chunks each
carrying their choice's ``index``, one ``usage`` for the request (the prompt counted once,
the completions summed).

Choice i samples with seed ``seed + i`` when the request has a seed, so choice 0 is the
request's n = 1 answer (on the plain path; under speculation a request's draws depend on
its drafts); greedy choices are equal.
``n`` is at most the server's ``--parallel`` (all choices run at once) and needs a shared KV
pool (not ``--exact`` with ``--parallel``): otherwise a 400 naming ``n``.
"""
from __future__ import annotations

import asyncio
import json

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from ..errors import ContextOverflowError, EdgespecError, UnsupportedError
from ..api.events import Finished, Step
from ..serving import DONE
from .errors import bad_request, context_overflow, unsupported
from .relay import check_ended, chunks, failure, finished_chunks, watch_disconnect, whole
from .responses import Shape, extension, usage


def check(scheduler, n: int) -> None:
    """n choices refused before anything is queued: a 400 naming ``n``."""
    try:
        scheduler.check_choices(n)
    except UnsupportedError as e:
        raise unsupported("n", str(e)) from None
    except EdgespecError as e:
        raise bad_request(str(e), param="n") from None


class _Tagged:
    """A choice's stand-in for a relay's queue: its events go to the shared queue as
    (index, event), so one consumer sees every choice in the order they happened."""

    def __init__(self, queue: asyncio.Queue, index: int) -> None:
        self.queue, self.index = queue, index

    def put_nowait(self, event) -> None:
        self.queue.put_nowait((self.index, event))


async def generate(request, kind: str, req, prompt, params, turn, *, n: int, scheduler, engine,
                   identity, new_relay, traffic: str):
    """The response to an n-choice request. ``new_relay()`` makes a per-request
    :class:`~edgespec.server.relay.Relay` (metrics included)."""
    check(scheduler, n)
    shared: asyncio.Queue = asyncio.Queue()
    relays = [new_relay() for _ in range(n)]
    for i, r in enumerate(relays):
        r.queue = _Tagged(shared, i)
    try:
        choices = await run_in_threadpool(lambda: scheduler.submit_n(
            prompt, params, n, on_event=lambda i, ev: relays[i](ev), traffic=traffic))
    except ContextOverflowError as e:
        raise context_overflow(kind, e) from None
    first = Shape(kind, req.model, identity.short, engine.target.token_piece)
    shapes = [first] + [Shape(kind, req.model, identity.short, engine.target.token_piece,
                              id=first.id, created=first.created) for _ in range(n - 1)]
    outs = [turn.output() if turn is not None else None for _ in range(n)]
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventSourceResponse(_stream(choices, shared, shapes, outs, include_usage,
                                           identity), sep="\n", ping=15)
    fins = await _collect(request, choices, shared, n)
    bodies = [whole(shape, out, fin, identity.hash) for shape, out, fin in zip(shapes, outs, fins)]
    body = bodies[0]
    body["choices"] = [dict(b["choices"][0], index=i) for i, b in enumerate(bodies)]
    body["usage"] = _usage(fins)
    body["edgespec"]["choices"] = [extension(f, identity.hash) for f in fins]
    return JSONResponse(body)


def _usage(fins: list[Finished]) -> dict:
    """The request's usage: the prompt once (it was prefilled once), every completion."""
    u = usage(fins[0])
    completion = sum(len(f.tokens) for f in fins)
    u.update(completion_tokens=completion, total_tokens=u["prompt_tokens"] + completion)
    return u


async def _collect(request, choices, shared: asyncio.Queue, n: int) -> list[Finished]:
    fins: list[Finished | None] = [None] * n
    done = 0
    gone = asyncio.Event()
    watcher = asyncio.create_task(watch_disconnect(request, choices, gone))
    try:
        while done < n:
            i, ev = await shared.get()
            if ev is DONE:
                done += 1
            elif isinstance(ev, BaseException):
                choices.cancel()  # one choice failed: the answer cannot be whole
                raise failure(ev)
            elif isinstance(ev, Finished):
                fins[i] = ev
    except asyncio.CancelledError:
        choices.cancel()
        raise
    finally:
        watcher.cancel()
    check_ended(gone, all(f is not None for f in fins))
    return fins


def _indexed(body: dict, i: int) -> str:
    for c in body["choices"]:
        c["index"] = i
    return json.dumps(body)


async def _stream(choices, shared: asyncio.Queue, shapes: list[Shape], outs,
                  include_usage: bool, identity):
    n = len(shapes)
    complete = False
    sent = [""] * n
    fins: list[Finished | None] = [None] * n
    done = 0
    try:
        for i, shape in enumerate(shapes):
            yield _indexed(shape.chunk("", first=True, include_usage=include_usage), i)
        while done < n:
            i, ev = await shared.get()
            shape, out = shapes[i], outs[i]
            if ev is DONE:
                done += 1
            elif isinstance(ev, BaseException):
                complete = True
                choices.cancel()
                yield json.dumps(failure(ev).body())
                return
            elif isinstance(ev, Step) and (ev.text or ev.logprobs):
                sent[i] += ev.text
                for body in chunks(shape, out, ev.text, ev.logprobs, include_usage):
                    yield _indexed(body, i)
            elif isinstance(ev, Finished):
                fins[i] = ev
                for body in finished_chunks(shape, out, ev, sent[i], identity.hash,
                                            include_usage):
                    yield _indexed(body, i)
        if include_usage and all(f is not None for f in fins):
            body = shapes[0].usage_chunk(fins[0])
            body["usage"] = _usage(fins)
            yield json.dumps(body)
        complete = True
        yield "[DONE]"
    finally:
        if not complete:  # the client went away: every choice stops
            choices.cancel()
