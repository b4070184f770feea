"""AsyncEngine on a real model (SmolLM2-135M, exact mode, n-gram drafting): events and chunks
cross to the loop without blocking it, and cancelling a task cancels its request and frees
the engine for the next one."""
from __future__ import annotations

import asyncio
import time

import pytest

from edgespec.errors import InvalidInputError
from edgespec.api.events import Finished, RequestStarted, Step
from edgespec.api.params import GenerationParams

MODEL = "smollm2-135m"
COUNTING = "Count from 1 to 500: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
CHAT = [{"role": "user", "content": "Name the planets in the solar system."}]


class Records:
    def __init__(self) -> None:
        self.records = []

    def emit(self, stats) -> None:
        self.records.append(stats)


@pytest.fixture
def engine(engine_factory):
    eng = engine_factory(MODEL)
    sink = Records()
    eng.sinks.append(sink)
    eng.records = sink.records
    yield eng
    eng.sinks.remove(sink)
    assert not eng._lock.locked(), "a test left a request holding the engine"


@pytest.fixture
def aengine(engine):
    from edgespec.apps import AsyncEngine
    return AsyncEngine(engine)


def run(coro, timeout: float = 300):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Ticker:
    """A coroutine that should keep ticking while the engine generates: the gaps between its
    ticks say whether anything blocked the loop."""

    def __init__(self, period: float = 0.01) -> None:
        self.period, self.times = period, []

    async def run(self) -> None:
        while True:
            self.times.append(time.perf_counter())
            await asyncio.sleep(self.period)

    def between(self, t0: float, t1: float) -> list[float]:
        return [t for t in self.times if t0 <= t <= t1]


def test_events_stream_and_the_loop_stays_responsive(aengine, engine):
    params = GenerationParams(max_tokens=24, chat=False)
    want = engine.generate(COUNTING, params)

    async def main():
        ticker = Ticker()
        tick = asyncio.create_task(ticker.run())
        await asyncio.sleep(0.05)
        events, t0 = [], time.perf_counter()
        async for ev in aengine.stream(COUNTING, params):
            events.append(ev)
        t1 = time.perf_counter()
        tick.cancel()
        return events, ticker.between(t0, t1), t1 - t0

    events, ticks, seconds = run(main())
    assert isinstance(events[0], RequestStarted) and isinstance(events[-1], Finished)
    assert events[-1].text == want.text and events[-1].tokens == want.tokens
    assert "".join(e.text for e in events if isinstance(e, Step)) == want.text
    assert any(e.drafted for e in events if isinstance(e, Step))  # speculation ran
    # the ticker kept running while the worker thread generated: a blocked loop would show
    # one gap as long as the whole request
    assert len(ticks) >= 5
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert max(gaps) < max(0.5, seconds / 2), (max(gaps), seconds)


def test_chat_chunks_and_whole_response(aengine, engine):
    from edgespec.apps.completions import create_chat_completion
    want = create_chat_completion(engine, CHAT, temperature=0, max_tokens=8)

    async def main():
        whole = await aengine.create_chat_completion(CHAT, temperature=0, max_tokens=8)
        chunks = [c async for c in await aengine.create_chat_completion(
            CHAT, temperature=0, max_tokens=8, stream=True)]
        text = await aengine.create_completion("The capital of France is", max_tokens=3,
                                               temperature=0)
        return whole, chunks, text

    whole, chunks, text = run(main())
    content = want["choices"][0]["message"]["content"]
    assert whole["choices"][0]["message"]["content"] == content
    assert whole["id"].startswith("chatcmpl-") and whole["usage"]["completion_tokens"] == 8
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == content
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert text["object"] == "text_completion" and text["usage"]["completion_tokens"] == 3


def test_bad_request_raises_at_the_await(aengine):
    async def main():
        with pytest.raises(InvalidInputError, match="prompt is empty"):
            async for _ in aengine.stream("   "):
                pass
        with pytest.raises(InvalidInputError, match="stop strings must be non-empty"):
            await aengine.create_chat_completion(CHAT, stop=[""])
    run(main())


def test_cancelling_the_task_cancels_the_request_and_frees_the_engine(aengine, engine):
    """A long request, cancelled once it streams: the await returns with the engine free
    (its lock released), the request ended as cancelled long before its token limit, and the
    next request runs at once."""
    async def main():
        first = asyncio.Event()

        async def long_request():
            async for ev in aengine.stream(COUNTING, GenerationParams(max_tokens=500,
                                                                      chat=False)):
                if isinstance(ev, Step) and ev.tokens:
                    first.set()

        task = asyncio.create_task(long_request())
        await asyncio.wait_for(first.wait(), 120)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        free = not engine._lock.locked()
        after = await aengine.create_completion("The capital of France is", max_tokens=2,
                                                temperature=0)
        return free, after

    free, after = run(main())
    assert free
    cancelled, nxt = engine.records[-2:]
    assert cancelled.stop_reason == "cancelled" and cancelled.generated_tokens < 500
    assert nxt.stop_reason == "length" and after["usage"]["completion_tokens"] == 2


def test_leaving_a_chunk_stream_early_cancels_it(aengine, engine):
    async def main():
        chunks = await aengine.create_chat_completion(
            [{"role": "user", "content": COUNTING}], max_tokens=400, temperature=0,
            stream=True)
        async for chunk in chunks:
            if chunk["choices"][0]["delta"].get("content"):
                break
        await chunks.aclose()
        return not engine._lock.locked()

    assert run(main())
    assert engine.records[-1].stop_reason == "cancelled"


def test_interleaved_requests_and_a_queued_cancel(aengine, engine):
    """While one request streams, two more wait for the engine; cancelling a waiting one
    leaves the running one alone (its own request, not the engine's current one, ends),
    and the loop keeps running throughout."""
    async def main():
        ticker = Ticker()
        tick = asyncio.create_task(ticker.run())
        t0 = time.perf_counter()
        a = await aengine.create_completion(COUNTING, max_tokens=16, temperature=0,
                                            stream=True)
        a_chunks = [await a.__anext__()]  # a holds the engine from here on
        b = asyncio.create_task(aengine.create_completion(COUNTING, max_tokens=12,
                                                          temperature=0))
        c = asyncio.create_task(aengine.create_chat_completion(CHAT, max_tokens=6,
                                                               temperature=0))
        await asyncio.sleep(0.1)
        b.cancel()
        a_chunks += [chunk async for chunk in a]
        done = await asyncio.gather(b, c, return_exceptions=True)
        t1 = time.perf_counter()
        tick.cancel()
        return a_chunks, done, len(ticker.between(t0, t1))

    a, (b, c), ticks = run(main())
    assert isinstance(b, asyncio.CancelledError)
    assert a[-1]["choices"][0]["finish_reason"] == "length"  # not cancelled by b's cancel
    assert c["usage"]["completion_tokens"] == 6
    assert ticks >= 5
    # b never ran: the engine served a, then c
    assert [(r.stop_reason, r.generated_tokens) for r in engine.records[-2:]] == \
        [("length", 16), ("length", 6)]
