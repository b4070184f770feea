"""asyncio over an engine: requests run on a worker thread, their events (or chunks) cross
to the event loop through an ``asyncio.Queue``, so a GUI or web loop never blocks.

    aengine = AsyncEngine(engine)                      # or AsyncEngine(Llama(...))
    async for ev in aengine.stream("Explain ...", GenerationParams(max_tokens=64)):
        ...                                            # RequestStarted, ..., Step, Finished
    out = await aengine.create_chat_completion(messages, max_tokens=32)
    async for chunk in await aengine.create_chat_completion(messages, stream=True):
        ...

Cancelling the task that awaits a request (or leaving its ``async for``) cancels the
request itself: the engine ends it at the next step boundary, and the cancelled await
returns only once the engine is free, so the next request starts at once. Requests from
several tasks take turns on the engine (one runs at a time, as with :meth:`Engine.stream`);
the loop keeps running other coroutines meanwhile.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import AsyncIterator, Callable, Iterator, Mapping, Sequence

from ..api.events import Event, Finished
from ..api.params import GenerationParams
from . import completions
from .llama_compat import Llama

# what the worker thread sends to the loop, as (kind, value)
_READY, _ITEM, _ERROR, _DONE = "ready", "item", "error", "done"


class AsyncEngine:
    """The asyncio face of an :class:`~edgespec.engine.Engine` (or of an
    :class:`~edgespec.apps.Llama`, whose instance defaults its completions keep)."""

    def __init__(self, engine) -> None:
        llama = engine if isinstance(engine, Llama) else None
        self.engine = llama.engine if llama is not None else engine
        self._defaults = llama._defaults if llama is not None else completions.Defaults()
        self._jobs: set[_Job] = set()

    async def stream(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
                     **options) -> AsyncIterator[Event]:
        """:meth:`Engine.stream` as an async iterator (``options``: its ``proposer``,
        ``control``, ``exact``, ``reuse``, ``traffic``); a bad request raises on the first
        ``async for`` step."""
        job = self._start(lambda guard: guard(self.engine.stream(prompt, params, **options)))
        await job.ready()
        async with contextlib.aclosing(job.items()) as events:
            async for ev in events:
                yield ev

    async def generate(self, prompt: str | Sequence[dict], params: GenerationParams | None = None,
                       **options):
        """:meth:`Engine.generate`, awaited: the request's ``Result``."""
        from ..engine.engine import Result  # deferred: it loads llama.cpp
        fin = None
        async for ev in self.stream(prompt, params, **options):
            if isinstance(ev, Finished):
                fin = ev
        return Result(text=fin.text, tokens=fin.tokens, stop_reason=fin.stop_reason,
                      stats=fin.stats, logprobs=tuple(fin.logprobs))

    async def create_chat_completion(self, messages: Sequence[Mapping], **kwargs):
        """``Llama.create_chat_completion``'s arguments and dicts, awaited; with
        ``stream=True`` an async iterator of chunks."""
        return await self._complete(completions.chat_call, messages, kwargs)

    async def create_completion(self, prompt: str, **kwargs):
        """``Llama.create_completion``'s arguments and dicts, awaited; with ``stream=True``
        an async iterator of chunks."""
        return await self._complete(completions.completion_call, prompt, kwargs)

    def cancel(self) -> None:
        """Cancel every request this object is running or has queued (thread-safe)."""
        for job in list(self._jobs):
            job.stop()

    # --- internals ---------------------------------------------------------------------
    async def _complete(self, make_call, prompt, kwargs):
        kwargs.setdefault("defaults", self._defaults)

        def start(guard):
            # validated on the worker: tokenizing a long prompt never blocks the loop
            call = make_call(self.engine, prompt, **kwargs)
            events = call.events(self.engine, wrap=guard)
            return call.chunks(events) if call.stream else _once(call.whole, events)

        job = self._start(start)
        await job.ready()
        if kwargs.get("stream"):
            return job.items()
        async with contextlib.aclosing(job.items()) as items:
            async for item in items:
                return item

    def _start(self, start) -> "_Job":
        job = _Job(self.engine, start, self._jobs.discard)
        self._jobs.add(job)
        return job


def _once(whole: Callable[[Iterator[Event]], dict], events: Iterator[Event]) -> Iterator[dict]:
    yield whole(events)


class _Job:
    """One request on its worker thread.

    ``engine.cancel()`` ends whatever request the engine is running, so it is called only
    while this job's request is the one running: between its first event (the engine's
    lock is held from then on) and its Finished. The worker then reads the request to its
    end (the engine's Finished, stop reason "cancelled", its stats recorded), dropping what
    nobody awaits any more. A stop asked before that (the request still waits for the
    engine behind another one) is seen at its first event, where the worker closes the
    engine's generator, which ends the request there; the cancelled await does not wait
    for that (the engine is the other request's meanwhile)."""

    def __init__(self, engine, start: Callable[[Callable], Iterator], done: Callable) -> None:
        self._engine = engine
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._running = False  # this request holds the engine and has not finished
        self._begun = False  # this request has held the engine
        self._cancelled = False  # engine.cancel() was called for it: read on to its Finished
        self._over = False  # the worker has sent _DONE and the loop has read it
        self._done = done
        self._thread = threading.Thread(target=self._work, args=(start,), daemon=True,
                                        name="edgespec-aio")
        self._thread.start()

    # --- worker thread -------------------------------------------------------------------
    def _work(self, start) -> None:
        items = None
        try:
            items = start(self._guard)
            self._send(_READY, None)
            for item in items:
                if not self._stopped.is_set():
                    self._send(_ITEM, item)
        except BaseException as e:  # delivered to the awaiting coroutine
            self._send(_ERROR, e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # the request is over either way
                    pass
            self._send(_DONE, None)

    def _guard(self, events: Iterator[Event]) -> Iterator[Event]:
        try:
            for ev in events:
                with self._lock:
                    if self._stopped.is_set() and not self._cancelled:
                        break
                    self._begun = True
                    self._running = not isinstance(ev, Finished)
                yield ev
        finally:
            with self._lock:
                self._running = False
            events.close()  # releases the engine (its lock) before the worker reports done

    def _send(self, kind: str, value) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody listens, end the request
            self._stopped.set()

    # --- event loop ----------------------------------------------------------------------
    def stop(self) -> bool:
        """Stop the request; whether it had begun on the engine (then the worker ends it
        at the engine's next step boundary and lets go of the engine)."""
        with self._lock:
            self._stopped.set()
            if self._running and not self._cancelled:
                self._engine.cancel()
                self._cancelled = True
            return self._begun

    async def ready(self) -> None:
        """Wait until the request is validated; raise its error if it is not."""
        try:
            kind, value = await self._queue.get()
        except BaseException:
            await self._end()
            raise
        if kind == _ERROR:
            await self._end()
            raise value

    async def items(self) -> AsyncIterator:
        try:
            while True:
                kind, value = await self._queue.get()
                if kind == _ITEM:
                    yield value
                elif kind == _ERROR:
                    raise value
                else:
                    self._finish()
                    return
        finally:
            await self._end()

    async def _end(self) -> None:
        """Stop the request if it still runs and wait until the worker has let go of the
        engine (a cancelled await returns with the engine free)."""
        if self._over:
            return
        if self.stop():
            while (await self._queue.get())[0] != _DONE:
                pass
        self._finish()

    def _finish(self) -> None:
        self._over = True
        self._done(self)


__all__ = ["AsyncEngine"]
