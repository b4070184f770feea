"""Events from the scheduler thread to a request's coroutine, and the pieces both the
one-choice routes (generation) and the n-choice ones (choices) build their answers from.

Events arrive on the scheduler thread and cross to the event loop through
``call_soon_threadsafe``; a client that goes away cancels its ticket, which frees its
sequence at the next step.
"""
from __future__ import annotations

import asyncio
import logging
import time

from fastapi import Request

from ..api.events import Finished
from ..errors import EdgespecError
from ..serving import DONE
from .errors import APIError, from_edgespec
from .metrics import ServerMetrics
from .responses import Shape

log = logging.getLogger("edgespec.server")

#: how often a non-streaming request checks that its client is still there
_DISCONNECT_POLL_SECONDS = 0.5


class Relay:
    """on_event for one request: runs on the scheduler thread, feeds the metrics and hands
    each event to the request's asyncio queue without blocking."""

    def __init__(self, loop: asyncio.AbstractEventLoop, metrics: ServerMetrics) -> None:
        self.loop = loop
        self.metrics = metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started = time.monotonic()
        self.ended = False  # a Finished or an error arrived

    def __call__(self, event) -> None:
        try:
            if event is DONE and not self.ended:
                # the scheduler ends a request cancelled while queued with DONE alone: it
                # is still a request that ended cancelled (back-to-back disconnects queue)
                self.metrics.observe_cancelled_queued(time.monotonic() - self.started)
            self.ended = self.ended or isinstance(event, (Finished, BaseException))
            self.metrics.observe(event)
        except Exception:  # metrics must never break a request
            log.exception("metrics failed on %r", type(event).__name__)
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server stopped, nobody is listening
            pass


async def watch_disconnect(request: Request, ticket, gone: asyncio.Event) -> None:
    """Cancel ``ticket`` once the client of a non-streaming request has gone away (a
    streaming one learns it from sse-starlette, which cancels its generator)."""
    while not await request.is_disconnected():
        await asyncio.sleep(_DISCONNECT_POLL_SECONDS)
    gone.set()
    ticket.cancel()


def failure(exc: BaseException) -> APIError:
    """The client-facing form of an error that reached a request through its relay."""
    if isinstance(exc, EdgespecError):
        return from_edgespec(exc)
    log.error("request failed on the scheduler thread", exc_info=exc)
    return APIError(500, f"internal error ({type(exc).__name__}); the server keeps serving, "
                         "please report this with the server log", type="server_error", code="internal_error")


def check_ended(gone: asyncio.Event, complete: bool) -> None:
    """After a non-streaming request's events: a 499 if its client went away, a 503 if
    it was dropped before it ran (the scheduler closed without draining)."""
    if gone.is_set():
        raise APIError(499, "the client closed the connection", code="client_closed")
    if not complete:
        raise APIError(503, "the request was dropped before it ran; retry",
                       type="server_error", code="dropped")


def whole(shape: Shape, out, fin: Finished, identity: str) -> dict:
    """A non-streaming choice's body; ``out`` is the turn's output parser, or None."""
    if out is None:
        return shape.whole(fin, identity)
    out.feed(fin.text)
    final = out.finish(fin.stop_reason)
    return shape.whole(fin, identity, out.message(), final.finish_reason)


def chunks(shape: Shape, out, text: str, lps, include_usage: bool) -> list[dict]:
    """Stream chunks for one step's text: as content, or through the turn's parsers (which
    may hold it back: a step's logprobs then travel in a chunk with an empty delta)."""
    if out is None:
        return [shape.chunk(text, lps, include_usage=include_usage)]
    deltas = out.feed(text)
    if not deltas:
        return [shape.chunk("", lps, delta={}, include_usage=include_usage)] if lps else []
    return [shape.chunk("", lps if i == 0 else (), delta=d, include_usage=include_usage)
            for i, d in enumerate(deltas)]


def finished_chunks(shape: Shape, out, fin: Finished, sent: str, identity: str,
                    include_usage: bool) -> list[dict]:
    """The stream chunks a choice's Finished brings, ``sent`` the text already streamed:
    the text the assembler held back and released, what the turn's parsers still held,
    and the final chunk."""
    bodies = []
    if fin.text.startswith(sent) and len(fin.text) > len(sent):
        # text the assembler held back (a possible stop string) and released
        bodies += chunks(shape, out, fin.text[len(sent):], (), include_usage)
    reason = None
    if out is not None:  # what the turn's parsers still held
        final = out.finish(fin.stop_reason)
        bodies += [shape.chunk("", delta=delta, include_usage=include_usage)
                   for delta in final.deltas]
        reason = final.finish_reason
    bodies.append(shape.final_chunk(fin, identity, include_usage, reason))
    return bodies
