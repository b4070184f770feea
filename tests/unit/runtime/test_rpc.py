"""The RPC split without llama.cpp: endpoint parsing, the protocol probe against scripted
servers on loopback (a good one, none, a silent one, junk, another protocol version), and
the layer placement against llama.cpp's own rule."""
from __future__ import annotations

import socket
import struct
import threading

import pytest

from edgespec.runtime import rpc
from edgespec.config import EngineConfig
from edgespec.runtime.kernel import KernelConfig
from edgespec.errors import InvalidInputError
from edgespec.planner.remote import PlacementError, assign, place, reserve
from edgespec.runtime.rpc import RemoteDevice, RemoteServer, RpcError

from fakes.planner import QWEN_15

GiB, MiB = 2**30, 2**20


# --- endpoints ---------------------------------------------------------------------------
def test_endpoints_parse_and_normalise():
    assert rpc.parse_endpoints(" 127.0.0.1:50052, host-b:0050053 ") == ("127.0.0.1:50052",
                                                                       "host-b:50053")
    assert rpc.parse_endpoints(None) == () and rpc.parse_endpoints("") == ()


@pytest.mark.parametrize("bad, says", [
    ("127.0.0.1", "host:port"), (":50052", "host:port"), ("h:", "host:port"),
    ("h:port", "port must be"), ("h:70000", "port must be"), ("h:0", "port must be"),
    ("[::1]:50052", "IPv6"), ("::1:50052", "IPv6"),
    ("a:1,a:1", "twice"), (",".join(f"h:{p}" for p in range(1, 18)), "at most 16"),
])
def test_bad_endpoints_are_refused_with_the_reason(bad, says):
    with pytest.raises(InvalidInputError, match=says):
        rpc.parse_endpoints(bad)


def test_engine_config_validates_rpc_and_split():
    EngineConfig(target="t", rpc=("127.0.0.1:5",), tensor_split=(1, 1)).validate()
    with pytest.raises(InvalidInputError, match="give --rpc"):
        EngineConfig(target="t", tensor_split=(1.0,)).validate()
    with pytest.raises(InvalidInputError, match=">= 0"):
        EngineConfig(target="t", rpc=("h:1",), tensor_split=(0.0, 0.0)).validate()
    with pytest.raises(InvalidInputError, match="host:port"):
        EngineConfig(target="t", rpc=("nohost",)).validate()


def test_placement_key_names_hosts_layers_and_shares_not_ports():
    assert rpc.placement_key((), 0, None) == ""
    a = rpc.placement_key(("10.0.0.2:1", "10.0.0.3:2"), 29, (0.5, 0.5))
    assert a == rpc.placement_key(("10.0.0.2:7", "10.0.0.3:8"), 29, (0.5, 0.5))
    assert a != rpc.placement_key(("10.0.0.2:1", "10.0.0.3:2"), 20, (0.5, 0.5))
    assert a != rpc.placement_key(("10.0.0.2:1", "10.0.0.3:2"), 29, (0.25, 0.75))


# --- the probe against scripted servers ----------------------------------------------------
class Scripted:
    """A loopback TCP server that answers one connection as ``script(conn)`` says."""

    def __init__(self, script):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen: list[tuple[int, bytes]] = []
        self.thread = threading.Thread(target=self._serve, args=(script,), daemon=True)
        self.thread.start()

    def _serve(self, script):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            try:
                script(self, conn)
            except OSError:
                pass

    def read_cmd(self, conn) -> tuple[int, bytes]:
        head = rpc._recv_exact(conn, 9)
        cmd, size = struct.unpack("<BQ", head)
        payload = rpc._recv_exact(conn, size) if size else b""
        self.seen.append((cmd, payload))
        return cmd, payload

    def close(self):
        self.sock.close()


def llama_rpc(version=(7, 0, 0), devices=((3 * GiB, 4 * GiB),), junk_after_hello=False):
    def script(srv, conn):
        cmd, _ = srv.read_cmd(conn)
        assert cmd == rpc.CMD_HELLO
        conn.sendall(struct.pack("<Q", 28) + bytes([*version, 0]) + bytes(24))
        if junk_after_hello:
            conn.sendall(b"\xff" * 64)
            return
        while True:
            try:
                cmd, payload = srv.read_cmd(conn)
            except ConnectionError:
                return
            if cmd == rpc.CMD_DEVICE_COUNT:
                conn.sendall(struct.pack("<QI", 4, len(devices)))
            elif cmd == rpc.CMD_GET_DEVICE_MEMORY:
                (i,) = struct.unpack("<I", payload)
                conn.sendall(struct.pack("<QQQ", 16, *devices[i]))
    return script


def test_probe_reads_version_and_each_devices_memory():
    srv = Scripted(llama_rpc(devices=((3 * GiB, 4 * GiB), (1 * GiB, 2 * GiB))))
    try:
        got = rpc.probe(srv.endpoint, timeout=5)
    finally:
        srv.close()
    assert got.version == (7, 0, 0)
    assert [(d.index, d.free, d.total) for d in got.devices] == [(0, 3 * GiB, 4 * GiB),
                                                                  (1, 1 * GiB, 2 * GiB)]
    # the handshake asks for no transport upgrade: all-zero capabilities
    assert srv.seen[0] == (rpc.CMD_HELLO, bytes(rpc.CONN_CAPS_SIZE))


def test_nobody_listening_is_a_clear_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(RpcError, match=r"cannot connect.*edgespec rpc-server --host 127.0.0.1 "
                                       rf"--port {port}"):
        rpc.probe(f"127.0.0.1:{port}", timeout=2)


def test_a_silent_server_times_out_and_says_it_may_be_busy():
    srv = Scripted(lambda s, conn: threading.Event().wait(3))
    try:
        with pytest.raises(RpcError, match="one client at a time"):
            rpc.probe(srv.endpoint, timeout=0.5)
    finally:
        srv.close()


def test_another_protocol_version_is_refused():
    srv = Scripted(llama_rpc(version=(6, 1, 0)))
    try:
        with pytest.raises(RpcError, match=r"protocol 6\.1\.0.*speaks 7\.0"):
            rpc.probe(srv.endpoint, timeout=5)
    finally:
        srv.close()


@pytest.mark.parametrize("script", [
    lambda s, conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"),   # not RPC at all
    lambda s, conn: conn.close(),                                        # hangs up
    llama_rpc(junk_after_hello=True),                                    # garbage device count
    llama_rpc(devices=()),                                               # no devices
])
def test_a_server_that_is_not_llama_rpc_is_refused(script):
    srv = Scripted(script)
    try:
        with pytest.raises(RpcError, match="not a working llama.cpp RPC server"):
            rpc.probe(srv.endpoint, timeout=2)
    finally:
        srv.close()


# --- placement ----------------------------------------------------------------------------
def server(ep, *free_total):
    return RemoteServer(ep, (7, 0, 0), tuple(RemoteDevice(ep, i, f, t)
                                             for i, (f, t) in enumerate(free_total)))


def test_assign_follows_llama_cpps_layer_rule():
    # 4 blocks + output, all offloaded, two equal devices: fractions 0, .2, .4 | .6, .8
    assert assign(4, 5, (1, 1)) == [0, 0, 0, 1, 1]
    # 3 layers offloaded: blocks 0-1 stay, then (0/3, 1/3) -> dev 0, 2/3 -> dev 1
    assert assign(4, 3, (1, 1)) == [-1, -1, 0, 0, 1]
    # unequal shares: 3:1
    assert assign(7, 8, (3, 1)) == [0, 0, 0, 0, 0, 0, 1, 1]
    assert assign(4, 0, (1, 1)) == [-1] * 5


def test_place_offloads_everything_that_fits_split_by_free_memory():
    servers = (server("a:1", (8 * GiB, 16 * GiB)), server("b:1", (8 * GiB, 16 * GiB)))
    p = place(QWEN_15, servers, n_ctx=4096, kernel=KernelConfig())
    assert p.n_gpu_layers == QWEN_15.n_layers + 1 and p.split == (0.5, 0.5)
    a, b = p.shares
    assert a.blocks == tuple(range(0, 15)) and b.blocks == tuple(range(15, 28))
    assert b.output and not a.output
    assert b.weights == 13 * QWEN_15.layer_bytes[0] + QWEN_15.output_bytes
    assert a.kv > 0 and a.kv * 13 == b.kv * 15  # KV follows the blocks
    assert "blocks 15-27 + output" in "\n".join(p.lines())


def test_place_keeps_here_what_the_servers_cannot_hold():
    small = reserve(2 * GiB) + GiB
    p = place(QWEN_15, (server("a:1", (small, 2 * GiB)),), n_ctx=4096, kernel=KernelConfig())
    assert 0 < p.n_gpu_layers < QWEN_15.n_layers + 1
    assert all(s.fits for s in p.shares)
    # one more layer would not fit
    more = place(QWEN_15, (server("a:1", (GiB * 64, GiB * 64)),), n_ctx=4096,
                 kernel=KernelConfig(), n_gpu_layers=p.n_gpu_layers + 1)
    assert more.shares[0].total > p.shares[0].budget


def test_a_forced_split_that_overflows_a_device_is_refused_with_the_fix():
    servers = (server("a:1", (8 * GiB, 16 * GiB)), server("b:1", (reserve(GiB) + 50 * MiB, GiB)))
    with pytest.raises(PlacementError, match=r"b:1#0 would hold .* smaller --tensor-split share"):
        place(QWEN_15, servers, n_ctx=4096, kernel=KernelConfig(), split=(1.0, 1.0),
              n_gpu_layers=29)
    with pytest.raises(PlacementError, match="gives 3 shares.*2 devices"):
        place(QWEN_15, servers, n_ctx=4096, kernel=KernelConfig(), split=(1, 1, 1))
    with pytest.raises(PlacementError, match="no RPC device has memory"):
        place(QWEN_15, (server("a:1", (100 * MiB, GiB)),), n_ctx=4096, kernel=KernelConfig())
