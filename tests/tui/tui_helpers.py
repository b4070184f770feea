"""TUI test helpers: literal event scripts and ways to wait for the app."""
from __future__ import annotations

import asyncio
import time

from edgespec.api.events import Finished, PrefillDone, RequestStarted, Step
from edgespec.tui.metrics import fold_stats

MIB = 2**20


def script(*steps: list[tuple[str, str]], proposer: str = "ngram", target: str = "scripted",
           stop: str = "length") -> list:
    """A whole request from steps given as [(piece, origin), ...].

    A step with draft pieces drafted one more token than it accepted; one without is plain.
    """
    events: list = [RequestStarted(1, 5, proposer, target), PrefillDone(1, 5, 0.05)]
    t, tok = 0.05, 100
    for pieces in steps:
        origins = tuple(o for _, o in pieces)
        n_acc = origins.count("draft")
        drafted = n_acc + 1 if n_acc else 0  # the draft's next token was rejected
        t += 0.1
        events.append(Step(1, tuple(range(tok, tok + len(pieces))), "".join(p for p, _ in pieces),
                           origins, proposer if drafted else None, drafted, n_acc,
                           0.001 * drafted, 0.1, t, pieces=tuple(p for p, _ in pieces)))
        tok += len(pieces)
    stats = fold_stats(events)
    stats.finish(stop, t)
    steps_ = [e for e in events if isinstance(e, Step)]
    events.append(Finished(1, "".join(s.text for s in steps_),
                           tuple(x for s in steps_ for x in s.tokens), stop, stats))
    return events


def start_request(app) -> None:
    """What ctrl+r does, without pilot.press, which waits for the app to go idle: with a
    stream posting events that only happens once the request is over."""
    app.action_run()


async def run_request(pilot, app, timeout: float = 10.0) -> None:
    """Press ctrl+r and wait until that request has ended and the screen shows it."""
    before = app.requests_started
    await pilot.press("ctrl+r")
    await wait_for(pilot, lambda: app.requests_started > before and not app.running, timeout)
    await pilot.pause()


async def wait_done(pilot, app, timeout: float = 10.0) -> None:
    """Until the running request has ended and the screen shows it."""
    await wait_for(pilot, lambda: not app.running, timeout)
    await pilot.pause()


async def wait_for(pilot, predicate, timeout: float = 10.0) -> None:
    """Poll without pilot.pause(), which would wait for a running stream to go quiet."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout} s")
        await asyncio.sleep(0.01)


def sync(test):
    """Run an async test with asyncio.run (no pytest-asyncio needed); fixtures pass through."""
    import functools

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper
