"""`edgespec rpc-server`: lend this machine's CPU to an engine elsewhere (docs/rpc.md).

It runs llama.cpp's own RPC server loop (the one llama.cpp's `rpc-server` tool runs) in
this process, from the llama.cpp edgespec links, so client and server speak the same
protocol. The loop blocks in C; it runs in a daemon thread so that SIGINT/SIGTERM end the
process at once.
"""
from __future__ import annotations

import signal
import socket
import sys
import threading

import click

from .common import handle_errors
from .options import THREADS
from ..errors import EdgespecError


@click.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --allow-remote.")
@click.option("--port", type=click.IntRange(1, 65535), default=50052, show_default=True)
@click.option("--threads", type=THREADS, default=None,
              help="CPU threads for the layers this server holds (default: physical cores).")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
              help="Keep received weights here by hash, so a client reloading the same model "
                   "sends only hashes.")
@click.option("--allow-remote", is_flag=True,
              help="Listen on a non-loopback address. The RPC protocol has no authentication "
                   "or encryption: only on a network you trust.")
@handle_errors
def rpc_server(host, port, threads, cache_dir, allow_remote):
    """Serve this machine's CPU to `--rpc` clients (llama.cpp's RPC protocol)."""
    from ..runtime import backend, ggml_devices  # deferred: they load llama.cpp
    from ..runtime.netaddr import is_loopback  # deferred: `edgespec` starts without what other commands need
    from ..runtime.rpc import PROTO_MAJOR, PROTO_MINOR  # deferred: `edgespec` starts without what other commands need

    if not is_loopback(host) and not allow_remote:
        raise EdgespecError(f"refusing to listen on {host}: llama.cpp's RPC protocol has no "
                            "authentication, anyone who reaches the port can run code on this "
                            "machine's memory; pass --allow-remote on a network you trust")
    try:  # llama.cpp prints a line and returns when it cannot listen: check first
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise EdgespecError(f"cannot listen on {host}:{port} ({e.strerror or e}): pick another "
                            "--port or stop what holds it") from None
    n = threads or backend.default_threads()
    ggml_devices.require_rpc()
    done = threading.Event()

    def run():
        try:
            ggml_devices.serve_rpc(f"{host}:{port}", n, cache_dir)
        finally:
            done.set()

    threading.Thread(target=run, name="rpc-server", daemon=True).start()
    click.echo(f"edgespec rpc-server: this machine's CPU ({n} threads) on {host}:{port}, "
               f"llama.cpp RPC protocol {PROTO_MAJOR}.{PROTO_MINOR}; Ctrl-C stops", err=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    sys.stdout.flush()
