"""Prometheus metrics of one server, on its own CollectorRegistry (several apps can live in
one process, and nothing leaks into prometheus_client's global registry).

Spec-decode counters follow vLLM's names (``vllm:spec_decode_num_drafts`` and friends) with
the ``edgespec_`` prefix; they are fed from each request's RequestStats when it finishes.
Queue depth and running sequences are read from the scheduler at scrape time; the canary's
per-slice state from the engine's goodput guard.

Outcomes add up. Every HTTP request that gets one is counted exactly once, in one of
``requests_finished{stop_reason}`` (it ran: one count however many choices), ``requests_rejected
{status,code}`` (refused before it ran) or ``requests_failed`` (it broke while running). Several
paths report the same request (each choice's events on the scheduler thread, then the error
the route answers, e.g. a 499 after a client that went away was cancelled), so each request
carries an :class:`Outcome` (a context variable set by :class:`Accounting`, the outermost
middleware; the core's relays take it along to the scheduler thread) and only the first report
counts. ``client_disconnects`` counts the clients seen to go away before their answer was
complete; each such request ends ``cancelled`` (when it was still running).
"""
from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator, Protocol

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, Info,
                               generate_latest)
from prometheus_client.core import GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._version import __version__
from ..api.events import Control, Finished
from ..api.stats import RequestStats
from ..serving.tickets import Delivery, QueueLoad

if TYPE_CHECKING:
    from ..engine.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                    2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class _Loaded(Protocol):
    """What the queue gauges read: a scheduler or a pool of them."""

    def load(self) -> QueueLoad: ...


class ServerMetrics:
    def __init__(self, scheduler: _Loaded, engine: Engine, served_model: str) -> None:
        self.registry = r = CollectorRegistry()
        p = "edgespec_"
        self.num_drafts = Counter(p + "spec_decode_num_drafts", "Verify passes that held at "
                                  "least one drafted token.", registry=r)
        self.num_draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Drafted tokens "
                                        "sent to verification.", registry=r)
        self.num_accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens", "Drafted "
                                           "tokens the target accepted.", registry=r)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted drafted tokens by draft position (0-based).",
                                        ["position"], registry=r)
        self.drafted_per_pos = Counter(p + "spec_decode_num_draft_tokens_per_pos",
                                       "Drafted tokens by draft position (0-based).",
                                       ["position"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests.",
                                     registry=r)
        self.prompt_reused = Counter(p + "prompt_tokens_reused", "Prompt tokens whose KV came "
                                     "from an earlier request (prefix reuse).", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens.",
                                         registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Request start to first "
                              "emitted token (prefill included).", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Gap between consecutive "
                             "emitted tokens (0 within one verify pass).",
                             buckets=(0.0,) + _LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Request start to finish.",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.finished = Counter(p + "requests_finished", "Requests that ran, by stop reason "
                                "(eos, stop, length, context, grammar, cancelled).",
                                ["stop_reason"], registry=r)
        self.rejected = Counter(p + "requests_rejected", "Requests refused before they ran, "
                                "by HTTP status and error code.", ["status", "code"],
                                registry=r)
        self.failed = Counter(p + "requests_failed", "Requests that failed while running.",
                              registry=r)
        self.disconnects = Counter(p + "client_disconnects", "Clients that went away before "
                                   "their answer was complete.", registry=r)
        self.control = Counter(p + "control_events", "Controller decisions by kind (fallback, "
                               "probe, recover, guard_off/on, canary...).", ["kind"],
                               registry=r)
        queued = Gauge(p + "num_requests_waiting", "Requests queued for a sequence.",
                       registry=r)
        queued.set_function(lambda: scheduler.load().queued)
        running = Gauge(p + "num_requests_running", "Requests running (sequences in use).",
                        registry=r)
        running.set_function(lambda: scheduler.load().running)
        slots = Gauge(p + "num_sequences", "Sequences the engine serves at once (--parallel).",
                      registry=r)
        slots.set_function(lambda: scheduler.load().slots)
        ident = engine.identity
        Info(p + "build", "The release identity this server runs (edgespec identity).",
             registry=r).info({"identity": ident.hash, "version": __version__,
                               "model": served_model, "proposer": engine.default_proposer,
                               "exact": str(bool(engine.exact)).lower()})
        r.register(_CanaryCollector(engine))

    # --- feeding --------------------------------------------------------------------------
    @staticmethod
    def outcome() -> "Outcome | None":
        """The current HTTP request's outcome (None outside one): read it where the request's
        context is (on the loop) and hand it to whatever reports from elsewhere."""
        return _CURRENT.get()

    def observe(self, event: Delivery, outcome: "Outcome | None" = None) -> None:
        """Called for every engine event (on the scheduler thread: cheap, never blocks);
        ``outcome``: the request's, so that its end is counted once."""
        if isinstance(event, Control):
            self.control.labels(event.kind).inc()
        elif isinstance(event, Finished):
            self.observe_stats(event.stats, None)
            if _first(outcome):
                self.finished.labels(event.stop_reason or "unknown").inc()
        elif isinstance(event, BaseException):
            if _first(outcome):
                self.failed.inc()

    def observe_stats(self, s: RequestStats, stop_reason: str | None) -> None:
        """One run's statistics; ``stop_reason`` (not None) also counts it as finished."""
        self.num_drafts.inc(s.verify_passes)
        self.num_draft_tokens.inc(s.drafted)
        self.num_accepted_tokens.inc(s.accepted)
        for i, (d, a) in enumerate(zip(s.position_drafted, s.position_accepted)):
            self.drafted_per_pos.labels(str(i)).inc(d)
            self.accepted_per_pos.labels(str(i)).inc(a)
        self.prompt_tokens.inc(s.prompt_tokens)
        self.prompt_reused.inc(s.prompt_reused)
        self.generation_tokens.inc(s.generated_tokens)
        if s.ttft_seconds is not None:
            self.ttft.observe(s.ttft_seconds)
        for gap in s.inter_token_latencies:
            self.itl.observe(gap)
        self.e2e.observe(s.total_seconds)
        if stop_reason is not None:
            self.finished.labels(stop_reason or "unknown").inc()

    def observe_cancelled_queued(self, seconds: float, outcome: "Outcome | None" = None) -> None:
        """A request cancelled before it left the queue: no stats, but an outcome and a
        latency like every request that was admitted."""
        self.e2e.observe(seconds)
        if _first(outcome):
            self.finished.labels("cancelled").inc()

    def reject(self, status: int, code: str | None) -> None:
        """A refusal answered (on the loop, in the request's context): counted unless the
        request already has its outcome (a 499 or 503 after its run ended)."""
        if _first(_CURRENT.get()):
            self.rejected.labels(str(status), code or "none").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Outcome:
    """One HTTP request's outcome: whether it has been counted (by any thread)."""

    __slots__ = ("_lock", "counted", "disconnected")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counted = False
        self.disconnected = False

    def claim(self) -> bool:
        """True for the first caller only."""
        with self._lock:
            first, self.counted = not self.counted, True
            return first


_CURRENT: ContextVar[Outcome | None] = ContextVar("edgespec_outcome", default=None)


def _first(outcome: Outcome | None) -> bool:
    return outcome is None or outcome.claim()


class Accounting:
    """Pure ASGI middleware, outermost: gives each HTTP request its :class:`Outcome`, counts
    a client seen to go away before its answer was complete (``http.disconnect`` from
    ``receive`` while the response is unfinished), and counts as rejected an error answer
    (4xx/5xx) that no route counted."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outcome = Outcome()
        token = _CURRENT.set(outcome)
        state = {"status": 0, "complete": False}

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not state["complete"] \
                    and not outcome.disconnected:
                outcome.disconnected = True
                self.metrics.disconnects.inc()
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                state["complete"] = True
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            _CURRENT.reset(token)
            if state["status"] >= 400 and outcome.claim():
                self.metrics.rejected.labels(str(state["status"]), "none").inc()


class _CanaryCollector:
    """Per traffic slice: whether speculation is on and the canary's measured goodput
    improvement over the plain path with its lower confidence bound (NaN until both arms
    have requests)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        enabled = GaugeMetricFamily("edgespec_canary_speculation_enabled", "1 while "
                                    "speculation is on for the traffic slice.", labels=["slice"])
        improvement = GaugeMetricFamily("edgespec_canary_goodput_improvement", "Goodput of "
                                        "speculative requests over the plain canary.",
                                        labels=["slice"])
        lower = GaugeMetricFamily("edgespec_canary_goodput_improvement_lower", "Lower "
                                  "confidence bound of that improvement.", labels=["slice"])
        for _ in range(3):  # the scheduler thread may add a slice while we read
            try:
                snap = self.engine.guard.canary_snapshot()
                break
            except RuntimeError:
                snap = {}
        for sl, st in snap.items():
            enabled.add_metric([sl], 1.0 if st["enabled"] else 0.0)
            improvement.add_metric([sl], _num(st["improvement"]))
            lower.add_metric([sl], _num(st["lower"]))
        yield enabled
        yield improvement
        yield lower

    def describe(self) -> list[GaugeMetricFamily]:
        return []


def _num(x: float | None) -> float:
    return float("nan") if x is None else float(x)
