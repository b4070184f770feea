"""Run an app under uvicorn, programmatically, with a draining shutdown.

On SIGINT/SIGTERM uvicorn stops accepting connections and waits (up to ``drain_seconds``)
for open requests, streams included, to finish; then the app's lifespan closes the
scheduler with drain=True, and :func:`serve` returns (the caller releases the engine and
exits 0). A second SIGINT exits at once (uvicorn's own behaviour).
"""
from __future__ import annotations

import signal

from ..errors import InvalidInputError
from ..netaddr import is_loopback  # noqa: F401 (cli/serve imports it from here)


def check_bind(host: str, allow_remote: bool) -> None:
    if not is_loopback(host) and not allow_remote:
        raise InvalidInputError(f"--host {host} is reachable from other machines; pass "
                                "--allow-remote to bind it (and --api-key to require a key), or "
                                "keep the default 127.0.0.1")


def serve(app, host: str, port: int, *, drain_seconds: float | None = 60.0,
          log_level: str = "info", on_started=None) -> None:
    import uvicorn
    from sse_starlette.sse import AppStatus

    # sse-starlette ends open streams on the first shutdown signal by default; we drain
    # them instead (uvicorn's graceful shutdown waits for them, bounded by drain_seconds)
    AppStatus.disable_automatic_graceful_drain()
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=drain_seconds, lifespan="on")
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
