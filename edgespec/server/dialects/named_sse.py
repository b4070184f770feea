"""The SSE body of a dialect whose stream is named events (Anthropic Messages, OpenAI
Responses): a stream object turns the core's events into ``(name, data)`` pairs, and a
failure after the stream began is the dialect's own error event, its last."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable, Protocol

from ...protocol.core import Running
from ...protocol.errors import ProtocolError
from ...protocol.events import CoreEvent
from .refusal import to_protocol

#: one named event: its name and its JSON data
Named = tuple[str, dict[str, Any]]


class NamedStream(Protocol):
    """A dialect's stream state (anthropic.MessageStream, responses.ResponseStream)."""

    def start(self) -> list[Named]: ...

    def feed(self, event: CoreEvent) -> list[Named]: ...


async def named_events(run: Running, stream: NamedStream, error: Callable[[ProtocolError], Named],
                       finished: Callable[[], None] = lambda: None
                       ) -> AsyncIterator[dict[str, str]]:
    """``run``'s events as sse-starlette's dicts; ``finished()`` once the stream is whole,
    ``error(err)`` the last event when it cannot be; a client that goes away cancels ``run``."""
    complete = False
    try:
        for name, data in stream.start():
            yield {"event": name, "data": json.dumps(data)}
        async for ev in run:
            for name, data in stream.feed(ev):
                yield {"event": name, "data": json.dumps(data)}
        complete = True
        finished()
    except Exception as e:  # the answer cannot continue: the dialect's in-stream error event
        complete = True
        name, data = error(to_protocol(e))
        yield {"event": name, "data": json.dumps(data)}
    finally:
        if not complete:  # the client went away (sse-starlette cancels this generator)
            run.cancel()
