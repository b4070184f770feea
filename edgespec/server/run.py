"""Run an app under uvicorn, programmatically: bounded connections, JSON for malformed HTTP,
and a shutdown with a stated bound.

Shutdown. The first SIGINT/SIGTERM stops accepting connections and gives open requests
(streams included) ``drain_seconds`` to finish; then ``abort()`` ends every request still
open with an error (a stream gets an error event and its end, a waiting client a 503
``shutting_down``: an answer cut short must not look complete), the app's lifespan releases
the models, and :func:`serve` returns. The process exits within ``drain_seconds`` +
:data:`EXIT_GRACE` seconds of the first signal whatever happens (a watchdog exits it, status
1); a second signal exits at once (status 128 + the signal). No traceback either way.

Connections. uvicorn closes a connection idle between requests after
``keep_alive_seconds``, but waits for ever on one that sent part of its request headers and
stopped (h11 has no read timeout): the protocol closes a connection whose request headers
are not complete ``read_seconds`` after it opened or after its last response. Open
connections are bounded in total and per client (edgespec.server.connections); accept
errors (file descriptors exhausted) are logged once per interval. A body that stops
arriving is the app's to time out (a 408, body.py).

Malformed HTTP (a bad Content-Length, a broken request line) is answered in the JSON error
shape every route uses, not uvicorn's plain text.
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
from http import HTTPStatus
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import InvalidInputError
from ..runtime.netaddr import is_loopback  # noqa: F401 (cli/serve imports it from here)
from .connections import ConnectionLimits, Connections, Throttled

if TYPE_CHECKING:
    import socket

    import uvicorn
    from starlette.types import ASGIApp
    from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("edgespec.server")

#: seconds beyond --drain-seconds that a stopping server may take to end the open requests
#: and release its models before the watchdog exits the process
EXIT_GRACE = 5.0
#: file descriptors kept for what is not a client connection (models, logs, pipes)
_FD_RESERVE = 64
_ACCEPT_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def check_bind(host: str, allow_remote: bool) -> None:
    if not is_loopback(host) and not allow_remote:
        raise InvalidInputError(f"--host {host} is reachable from other machines; pass "
                                "--allow-remote to bind it (and --api-key to require a key), or "
                                "keep the default 127.0.0.1")


def serve(app: ASGIApp, host: str, port: int, *, drain_seconds: float = 10.0,
          log_level: str = "info", on_started: Callable[[int | None], None] | None = None,
          read_seconds: float = 30.0,
          keep_alive_seconds: float = 5.0, limits: ConnectionLimits | None = None,
          abort: Callable[[], None] | None = None, more_ports: Sequence[int] = (),
          say: Callable[[str], None] | None = None,
          on_ports: Callable[[list[int]], None] | None = None) -> None:
    """Serve ``app`` on ``host:port`` (and ``more_ports``, same host) until a signal.
    ``on_ports(ports)``: every bound port, ``port``'s first then ``more_ports``' in order
    (port 0 picks one), once listening and before ``on_started``.

    ``abort`` ends every open request with an error (called on a worker thread once the
    drain window is over); ``say`` prints one line for the user (default: stderr)."""
    # deferred: the [server] extra, imported only by `edgespec serve`
    import uvicorn
    from sse_starlette.sse import AppStatus

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    limits = (limits or ConnectionLimits()).validate()
    _raise_fd_limit(limits.total + _FD_RESERVE, say)
    # sse-starlette ends open streams on the first shutdown signal by default; we drain
    # them instead, then end them with an error (abort). (sse-starlette leaves this one
    # unannotated.)
    AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            # the watchdog (_Stopping) ends the process first, without
                            # uvicorn's cancellation tracebacks
                            # uvicorn annotates both timeouts int; it hands them to asyncio,
                            # which takes fractions of a second too
                            timeout_graceful_shutdown=drain_seconds  # type: ignore[arg-type]
                            + EXIT_GRACE + 5, lifespan="on",
                            timeout_keep_alive=keep_alive_seconds,  # type: ignore[arg-type]
                            http=_protocol(read_seconds, Connections(limits),
                                           _refusals_counter(app)))
    sockets = [config.bind_socket()]
    for extra in more_ports:
        sockets.append(uvicorn.Config(app, host=host, port=extra, log_level=log_level)
                       .bind_socket())
    server = uvicorn.Server(config)
    _on_startup(server, on_started, on_ports)
    stopping = _Stopping(server, drain_seconds, abort, say)
    # what uvicorn's capture_signals installs (a method, replaced on this one server)
    setattr(server, "handle_exit", stopping.signal)
    server.run(sockets=sockets)
    if stopping.first is not None:
        # uvicorn restored the handlers it replaced: while the caller releases the models, a
        # second signal still exits at once, without a KeyboardInterrupt traceback
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stopping.signal)


class _Stopping:
    """The signal handler: the first signal starts the shutdown (module doc), a second one
    exits at once."""

    def __init__(self, server: uvicorn.Server, drain_seconds: float,
                 abort: Callable[[], None] | None, say: Callable[[str], None]) -> None:
        self.server = server
        self.drain_seconds = drain_seconds
        self.abort = abort
        self.say = say
        self.first: float | None = None

    def signal(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if self.first is not None:
            self.say(f"edgespec serve: {name} again, exiting now")
            os._exit(128 + sig)
        self.first = time.monotonic()
        self.say(f"edgespec serve: {name}: stopping; open requests have {self.drain_seconds:g} s "
                 f"to finish, then end with an error (send {name} again to exit at once)")
        self.server.should_exit = True
        threading.Thread(target=self._watch, name="edgespec-shutdown", daemon=True).start()

    def _watch(self) -> None:
        time.sleep(self.drain_seconds)
        if self.abort is not None:
            try:
                self.say(f"edgespec serve: {self.drain_seconds:g} s passed; ending what is "
                         "still open with an error")
                self.abort()
            except Exception:  # the watchdog below still bounds the exit
                log.exception("ending the open requests failed")
        assert self.first is not None  # set by the signal that started this thread
        time.sleep(max(0.0, self.first + self.drain_seconds + EXIT_GRACE - time.monotonic()))
        self.say(f"edgespec serve: still stopping {self.drain_seconds + EXIT_GRACE:g} s after "
                 "the signal; exiting now")
        os._exit(1)


def _raise_fd_limit(needed: int, say: Callable[[str], None]) -> None:
    """Open files: the soft limit raised toward ``needed`` (up to the hard limit), so the
    connection cap, not the descriptor table, is what bounds connections."""
    try:
        import resource  # deferred: Unix only (Windows has no descriptor limit to raise)
    except ImportError:
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            target = soft
        if target < needed:
            say(f"warning: this process may open {target} files; --max-connections "
                f"{needed - _FD_RESERVE} needs {needed} (raise `ulimit -n` or lower it)")


def _refusals_counter(app: ASGIApp) -> Callable[[int, str], None]:
    """``count(status, code)`` for the refusals answered below the app (malformed HTTP, a
    connection over the cap): in the app's metrics (edgespec.server.metrics), if it has
    them, like every refusal a route answers."""
    metrics = getattr(getattr(app, "state", None), "metrics", None)
    reject = getattr(metrics, "reject", None)
    return reject if reject is not None else (lambda status, code: None)


def _protocol(read_seconds: float, connections: Connections,
              count: Callable[[int, str], None] = lambda status, code: None
              ) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline, the connection caps and JSON errors
    for malformed HTTP (see the module doc)."""
    # deferred: the [server] extra, imported only by `edgespec serve`
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class _Protocol(H11Protocol):
        _headers_deadline: asyncio.TimerHandle | None = None
        _bad_request: h11.RemoteProtocolError | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            next_event = self.conn.next_event

            def remembering_next_event() -> Any:
                try:
                    return next_event()
                except h11.RemoteProtocolError as e:
                    self._bad_request = e  # for send_400_response, which is not told
                    raise

            setattr(self.conn, "next_event", remembering_next_event)  # this connection's

        # --- the connection caps ----------------------------------------------------------
        # uvicorn's own override narrows asyncio's BaseTransport to Transport, as this does
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            client = self.client[0] if self.client else "?"
            if not connections.admit(self, client):
                log.warning("refused a connection from %s: %d open (%d from it), each busy "
                            "with a request (--max-connections)", client, len(connections),
                            connections.of(client))
                count(503, "too_many_connections")
                self._refuse()
                return
            self._await_headers()

        def idle(self) -> bool:
            return (self.cycle is None or self.cycle.response_complete) \
                and self.conn.their_state is h11.IDLE

        def close(self) -> None:
            self._stop_waiting()
            if not self.transport.is_closing():
                self.transport.close()

        def _refuse(self) -> None:
            body = json.dumps({"error": {
                "message": "the server holds as many connections as it allows, each busy "
                           "with a request; retry shortly", "type": "server_error",
                "param": None, "code": "too_many_connections"}}).encode()
            self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: "
                                 b"application/json\r\nretry-after: 1\r\nconnection: close\r\n"
                                 b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
                                 + body)
            self.transport.close()

        # --- the header deadline ----------------------------------------------------------
        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
                self._stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            connections.active(self)
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._await_headers()  # the next request on this connection

        def connection_lost(self, exc: Exception | None) -> None:
            connections.release(self)
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

        # --- malformed HTTP ---------------------------------------------------------------
        def send_400_response(self, msg: str) -> None:
            e = self._bad_request
            status = getattr(e, "error_status_hint", 400) or 400
            count(status, "malformed_http")
            detail = str(e)[:200] if e is not None else "malformed request"
            body = json.dumps({"error": {
                "message": f"the request is not valid HTTP/1.1 ({detail}); send a well-formed "
                           "request (a numeric Content-Length, a request line and headers "
                           "as RFC 9112 has them)", "type": "invalid_request_error",
                "param": None, "code": "malformed_http"}}).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            try:
                self.transport.write(self.conn.send(h11.Response(
                    status_code=status, headers=headers,
                    reason=HTTPStatus(status).phrase.encode())))
                self.transport.write(self.conn.send(h11.Data(data=body)))
                self.transport.write(self.conn.send(h11.EndOfMessage()))
            except h11.LocalProtocolError:  # a response was already under way: just close
                pass
            self.transport.close()

    return _Protocol


def _on_startup(server: uvicorn.Server, callback: Callable[[int | None], None] | None,
                on_ports: Callable[[list[int]], None] | None = None) -> None:
    """Once uvicorn listens: accept errors throttled, ``on_ports(ports)`` (every bound
    port) and ``callback(port)`` (the bound port, so --port 0 works)."""
    startup = server.startup

    async def startup_then_notify(sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_accept_errors_throttled(loop))
        await startup(sockets=sockets)
        if server.started and on_ports is not None:
            on_ports([s.getsockname()[1] for srv in server.servers for s in srv.sockets])
        if server.started and callback is not None:
            port = next((s.getsockname()[1] for srv in server.servers
                         for s in srv.sockets), None)
            callback(port)

    setattr(server, "startup", startup_then_notify)  # this server's startup, wrapped


def _accept_errors_throttled(loop: asyncio.AbstractEventLoop
                             ) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """The loop's exception handler: an accept that failed for want of file descriptors
    (asyncio retries it every second, per listening socket) is logged once per 10 s;
    everything else as asyncio would."""
    say = Throttled(log.error, interval=10.0)

    def handler(loop_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRNOS:
            say(f"cannot accept connections: {exc.strerror} (errno {exc.errno}); lower "
                "--max-connections or raise `ulimit -n`")
            return
        loop_.default_exception_handler(context)

    return handler
