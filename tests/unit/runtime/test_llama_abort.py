"""A failure llama.cpp cannot return from ends the process with one edgespec error line
(issue 29): the message naming a lost RPC server, and ggml's own abort path driven for
real in a subprocess (the callback edgespec installs, not gdb's backtrace on stdout)."""
from __future__ import annotations

import socket
import subprocess
import sys

from edgespec.runtime import backend, rpc


def _listening() -> tuple[socket.socket, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_the_lost_server_is_named_among_live_ones():
    live, alive = _listening()
    gone = _closed_port()
    try:
        assert rpc.unreachable([alive, gone]) == [gone]
        msg = rpc.lost_server_message([alive, gone], "ggml-rpc.cpp:566: Remote RPC server crashed")
    finally:
        live.close()
    assert msg.startswith(f"RPC server {gone} stopped answering while this run used it "
                          "(ggml-rpc.cpp:566: Remote RPC server crashed)")
    port = gone.rpartition(":")[2]
    assert f"`edgespec rpc-server --host 127.0.0.1 --port {port}`" in msg and alive not in msg


def test_when_every_server_still_accepts_all_are_suspects():
    a, ea = _listening()
    b, eb = _listening()
    try:
        msg = rpc.lost_server_message([ea, eb], "returned malformed response")
    finally:
        a.close()
        b.close()
    assert msg.startswith(f"RPC server (one of {ea}, {eb}) stopped answering")


def test_abort_line_shortens_the_source_path_and_says_what_kind_of_failure():
    line = backend.abort_line("/tmp/pip-wheel-x/vendor/llama.cpp/ggml/src/ggml-cpu/ops.cpp:42: "
                              "GGML_ASSERT(n > 0) failed")
    assert "(ops.cpp:42: GGML_ASSERT(n > 0) failed)" in line and "/tmp/pip" not in line
    assert "bug in llama.cpp or edgespec" in line and "EDGESPEC_LLAMA_LOG=1" in line


def test_ggml_abort_ends_the_process_with_one_line_and_keeps_stdout_clean():
    """ggml_abort itself, called through libggml: before, ggml printed its message and ran
    gdb on the process (the backtrace on stdout) and died of SIGABRT."""
    code = (
        "from edgespec.runtime import backend\n"
        "backend.ensure_init()\n"
        "from llama_cpp import _ggml\n"
        "print('generated text', end='')\n"  # still in Python's buffer: the callback flushes it
        "_ggml.libggml.ggml_abort(b'/build/ggml/src/ggml.c', 7, b'GGML_ASSERT(%s) failed', "
        "b'x')\n"
        "print('never reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == backend.ABORT_EXIT == 1, proc.stderr
    assert proc.stdout == "generated text"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: llama.cpp stopped on a failure"), \
        proc.stderr
    assert "(ggml.c:7: GGML_ASSERT(x) failed)" in lines[0]
