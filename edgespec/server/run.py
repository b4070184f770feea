"""Run an app under uvicorn, programmatically, with a draining shutdown.

On SIGINT/SIGTERM uvicorn stops accepting connections and waits (up to ``drain_seconds``)
for open requests, streams included, to finish; then the app's lifespan closes the
scheduler with drain=True, and :func:`serve` returns (the caller releases the engine and
exits 0). A second SIGINT exits at once (uvicorn's own behaviour).

Silent clients. uvicorn closes a connection idle between requests after
``keep_alive_seconds``, but waits for ever on one that sent part of its request headers and
stopped (h11 has no read timeout): :class:`_TimedH11` closes a connection whose request
headers are not complete ``read_seconds`` after it opened or after its last response. A
body that stops arriving is the app's to time out (a 408, app._body).
"""
from __future__ import annotations

import asyncio
import signal

from ..errors import InvalidInputError
from ..runtime.netaddr import is_loopback  # noqa: F401 (cli/serve imports it from here)


def check_bind(host: str, allow_remote: bool) -> None:
    if not is_loopback(host) and not allow_remote:
        raise InvalidInputError(f"--host {host} is reachable from other machines; pass "
                                "--allow-remote to bind it (and --api-key to require a key), or "
                                "keep the default 127.0.0.1")


def serve(app, host: str, port: int, *, drain_seconds: float | None = 60.0,
          log_level: str = "info", on_started=None, read_seconds: float = 30.0,
          keep_alive_seconds: float = 5.0) -> None:
    # deferred: the [server] extra, imported only by `edgespec serve`
    import uvicorn
    from sse_starlette.sse import AppStatus

    # sse-starlette ends open streams on the first shutdown signal by default; we drain
    # them instead (uvicorn's graceful shutdown waits for them, bounded by drain_seconds)
    AppStatus.disable_automatic_graceful_drain()
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=drain_seconds, lifespan="on",
                            timeout_keep_alive=keep_alive_seconds,
                            http=_timed_h11(read_seconds))
    server = uvicorn.Server(config)
    if on_started is not None:
        _notify_when_started(server, on_started)
    # uvicorn re-raises the signal that stopped it once it has drained, which would kill
    # the process before the caller releases the engine: end serve() instead
    previous = {sig: signal.signal(sig, _drained) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    except _Drained:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Drained(Exception):
    pass


def _drained(sig, frame) -> None:
    raise _Drained(sig)


def _timed_h11(read_seconds: float):
    """uvicorn's h11 protocol with a deadline on request headers (see the module doc)."""
    # deferred: the [server] extra, imported only by `edgespec serve`
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class _TimedH11(H11Protocol):
        _headers_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
                self._stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._await_headers()  # the next request on this connection

        def connection_lost(self, exc) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

        def _await_headers(self) -> None:
            self._stop_waiting()
            self._headers_deadline = self.loop.call_later(read_seconds, self._headers_late)

        def _stop_waiting(self) -> None:
            if self._headers_deadline is not None:
                self._headers_deadline.cancel()
                self._headers_deadline = None

        def _headers_late(self) -> None:
            self._headers_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()  # nothing to answer: there is no request yet

    return _TimedH11


def _notify_when_started(server, callback) -> None:
    """Call ``callback(port)`` once uvicorn listens (the bound port, so --port 0 works)."""
    startup = server.startup

    async def startup_then_notify(sockets=None):
        await startup(sockets=sockets)
        if server.started:
            port = next((s.getsockname()[1] for srv in server.servers
                         for s in srv.sockets), None)
            callback(port)

    server.startup = startup_then_notify
