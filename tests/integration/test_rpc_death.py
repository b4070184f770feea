"""An `--rpc` server that dies mid-generation (issue 29): the client ends with one edgespec
error line on stderr and exit status 1; stdout holds the generated text and nothing else.

Before, llama.cpp's RPC client aborted the process (SIGABRT) and ggml's abort handler ran
gdb on it, whose backtrace went to the user's stdout after the generated text.
"""
from __future__ import annotations

import os
import signal
import subprocess

from test_rpc_real import _edgespec, _free_port, start_server

PROMPT = "Count from one to two hundred in words, one number per line."
# what ggml's abort path prints (gdb's backtrace, or glibc's backtrace_symbols fallback)
BACKTRACE_MARKS = ("gdb", "#0 ", "#1 ", "ggml_abort", "ggml_print_backtrace", "libggml",
                   "[Inferior", "ptrace", "Thread 0x", "[New LWP", "backtrace")


def test_a_server_killed_mid_generation_is_one_error_line_and_clean_stdout(model_path):
    port = _free_port()
    server = start_server(port)
    try:
        client = subprocess.Popen(
            _edgespec() + ["generate", "--target", str(model_path("smollm2-135m")),
                           "--proposer", "none", "--threads", "1", "--ctx", "2048",
                           "--max-tokens", "1500", "--rpc", f"127.0.0.1:{port}", PROMPT],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = os.read(client.stdout.fileno(), 64)  # generation is under way
        assert first, client.stderr.read().decode()
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(10)
    try:
        rest, err = client.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # pragma: no cover - the client must notice
        client.kill()
        raise
    out, err = (first + rest).decode("utf-8", "replace"), err.decode("utf-8", "replace")
    assert client.returncode == 1, f"exit {client.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], err
    assert f"RPC server 127.0.0.1:{port} stopped answering while this run used it" in errors[0]
    assert "edgespec rpc-server" in errors[0]  # what to do
    for mark in BACKTRACE_MARKS:
        assert mark not in out, f"{mark!r} on stdout:\n{out}"
        assert mark not in err, f"{mark!r} on stderr:\n{err}"
    assert len(out.strip()) >= len(first.strip())
