"""llama.cpp's RPC backend: a target's layers on other machines (``--rpc host:port,...``).

An RPC server (``edgespec rpc-server``, or llama.cpp's own ``ggml-rpc-server``) lends one
machine's compute device over TCP; llama.cpp then places some of a model's layers there,
and each pass sends the hidden states through. This module knows endpoints and speaks just
enough of the protocol (HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY) to check a server before
llama.cpp connects to it: llama.cpp *aborts the process* when a server cannot be reached,
speaks another protocol version or answers malformed, so every endpoint is probed here
first and a bad one is an :class:`RpcError` that says what to do.

Wire format (ggml-rpc.cpp, protocol 7.x): a request is ``cmd (u8) | size (u64) |
payload``, a response ``size (u64) | payload``, little-endian. A server serves one client
at a time: while an engine holds it, a probe from elsewhere waits and times out.

    servers = [probe(e) for e in parse_endpoints("10.0.0.2:50052,10.0.0.3:50052")]
    servers[0].devices[0].free   # bytes free on that machine's device
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from ..errors import EdgespecError, InvalidInputError

#: the protocol of the llama.cpp that llama-cpp-python 0.3.36 vendors (ggml-rpc.h)
PROTO_MAJOR, PROTO_MINOR = 7, 0
MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS
DEFAULT_PORT = 50052
CONN_CAPS_SIZE = 24  # rpc_msg_hello_req: conn_caps only; zero asks for no transport upgrade
CMD_GET_DEVICE_MEMORY, CMD_HELLO, CMD_DEVICE_COUNT = 11, 14, 15
#: a server reporting more devices than this is not a llama.cpp RPC server
MAX_DEVICES = 64
PROBE_TIMEOUT = 5.0


class RpcError(EdgespecError):
    """An RPC server is unreachable, busy, of another protocol version, or not one at all."""


@dataclass(frozen=True)
class RemoteDevice:
    endpoint: str
    index: int   # the device's number on its server
    free: int    # bytes
    total: int

    @property
    def label(self) -> str:
        return f"{self.endpoint}#{self.index}"


@dataclass(frozen=True)
class RemoteServer:
    endpoint: str
    version: tuple[int, int, int]
    devices: tuple[RemoteDevice, ...]


def parse_endpoint(text: str) -> str:
    """``host:port`` as llama.cpp parses it (the first ':' splits, so no IPv6 literals)."""
    s = str(text).strip()
    host, sep, port = s.partition(":")
    if s.count(":") > 1 or host.startswith("["):
        raise InvalidInputError(f"RPC endpoint {text!r}: llama.cpp's RPC client takes a host name "
                                "or an IPv4 address, not an IPv6 literal")
    if not sep or not host or not port:
        raise InvalidInputError(f"RPC endpoint {text!r} is not host:port (e.g. 127.0.0.1:{DEFAULT_PORT})")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidInputError(f"RPC endpoint {text!r}: the port must be a number from 1 to 65535")
    return f"{host}:{int(port)}"


def parse_endpoints(value: str | tuple | list | None) -> tuple[str, ...]:
    """A comma-separated list (or a sequence) of endpoints, checked and without duplicates."""
    if value is None:
        return ()
    parts = [p for p in (value.split(",") if isinstance(value, str) else value) if str(p).strip()]
    out = tuple(parse_endpoint(p) for p in parts)
    if len(set(out)) != len(out):
        raise InvalidInputError(f"--rpc names a server twice ({', '.join(out)})")
    if len(out) > MAX_SERVERS:
        raise InvalidInputError(f"--rpc takes at most {MAX_SERVERS} servers (got {len(out)})")
    return out


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    return bytes(buf)


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ValueError(f"answered {size} bytes to command {cmd} where {reply_size} were due")
    return _recv_exact(sock, size)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> RemoteServer:
    """Connect, shake hands and ask each device's memory; the connection is closed after,
    so llama.cpp's own connection is served next."""
    ep = parse_endpoint(endpoint)
    host, _, port = ep.partition(":")
    hint = (f"start one there (`edgespec rpc-server --host {host} --port {port}`, or llama.cpp's "
            "`ggml-rpc-server`)")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.timeout:
        raise RpcError(f"RPC server {ep} did not accept a connection within {timeout:g} s: {hint}") from None
    except OSError as e:
        raise RpcError(f"cannot connect to RPC server {ep} ({e.strerror or e}): {hint}") from None
    try:
        with sock:
            sock.settimeout(timeout)
            rsp = _call(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
            version = (rsp[0], rsp[1], rsp[2])
            if version[0] != PROTO_MAJOR or version[1] > PROTO_MINOR:
                raise RpcError(
                    f"RPC server {ep} speaks protocol {'.'.join(map(str, version))}, this "
                    f"llama.cpp speaks {PROTO_MAJOR}.{PROTO_MINOR}.x: run a server built from the "
                    "same llama.cpp (`edgespec rpc-server` from the same edgespec install)")
            (count,) = struct.unpack("<I", _call(sock, CMD_DEVICE_COUNT, b"", 4))
            if not 1 <= count <= MAX_DEVICES:
                raise ValueError(f"reported {count} devices")
            devices = []
            for i in range(count):
                free, total = struct.unpack("<QQ", _call(sock, CMD_GET_DEVICE_MEMORY,
                                                         struct.pack("<I", i), 16))
                devices.append(RemoteDevice(ep, i, int(free), int(total)))
    except socket.timeout:
        raise RpcError(f"RPC server {ep} accepted but did not answer within {timeout:g} s; a "
                       "llama.cpp RPC server serves one client at a time: is another engine "
                       "using it?") from None
    except (OSError, ConnectionError, ValueError, struct.error) as e:
        raise RpcError(f"{ep} is not a working llama.cpp RPC server ({e}): {hint}") from None
    return RemoteServer(ep, version, tuple(devices))


def probe_all(endpoints, timeout: float = PROBE_TIMEOUT) -> tuple[RemoteServer, ...]:
    return tuple(probe(e, timeout) for e in parse_endpoints(endpoints))


def placement_key(endpoints, n_layers: int, split) -> str:
    """Where a target's layers run, for caches keyed by it (calibrations, identity): '' when
    all run here. Hosts, not ports: a server restarted on another port is the same machine."""
    if not endpoints:
        return ""
    hosts = ",".join(e.rpartition(":")[0] for e in endpoints)
    shares = "auto" if split is None else ",".join(f"{float(x):g}" for x in split)
    return f"rpc={hosts};layers={n_layers};split={shares}"


def unreachable(endpoints, timeout: float = 0.5) -> list[str]:
    """The endpoints where nothing accepts a TCP connection now. A connection only, no
    handshake: a live server busy with this process's own connection still accepts one
    (into its listen backlog), so only a server that is gone shows."""
    out = []
    for ep in endpoints:
        host, _, port = ep.partition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except OSError:
            out.append(ep)
    return out


def lost_server_message(endpoints, detail: str) -> str:
    """What to tell a user whose RPC server died while llama.cpp was using it (llama.cpp's
    own ``detail``), naming the servers that no longer answer where that can be seen."""
    eps = list(endpoints)
    dead = unreachable(eps)
    which = (", ".join(dead) if dead else
             f"{eps[0]}" if len(eps) == 1 else f"(one of {', '.join(eps)})")
    host, _, port = (dead or eps or ["HOST:PORT"])[0].partition(":")
    return (f"RPC server {which} stopped answering while this run used it ({detail}); the "
            f"layers it held went with it, so the run cannot continue: restart it "
            f"(`edgespec rpc-server --host {host} --port {port}`) and run again")
