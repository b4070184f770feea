"""llama.cpp's own grammar engine, bound: a grammar sampler over a model's vocabulary
(edgespec.grammar drives it) and the parser's verdict on a grammar text, no model needed."""
from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

from .backend import ensure_init, ll as _ll, log_mark, log_since
import tempfile


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class Grammar:
    """One llama.cpp grammar sampler: which tokens may come next, advanced token by token.

    ``accept`` must only be given a token ``allowed`` admits: llama.cpp throws a C++
    exception for any other, which no ctypes caller can catch (the process aborts).
    """

    def __init__(self, handle) -> None:
        self._s = handle
        self._buf = np.zeros(0, dtype=_TOKEN_DATA)

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """For each token id, whether the grammar admits it next (EOG only where complete)."""
        n = int(ids.shape[0])
        if self._buf.shape[0] < n:
            self._buf = np.zeros(max(n, 2 * self._buf.shape[0]), dtype=_TOKEN_DATA)
        buf = self._buf[:n]
        buf["id"] = ids
        buf["logit"] = 0.0
        arr = _ll.llama_token_data_array(
            data=buf.ctypes.data_as(_ll.llama_token_data_p), size=n, selected=-1, sorted=False)
        _ll.llama_sampler_apply(self._s, ctypes.byref(arr))
        # the sampler keeps the array's order and sets a rejected token's logit to -inf
        return np.isfinite(buf["logit"])

    def accept(self, token: int) -> None:
        _ll.llama_sampler_accept(self._s, int(token))

    def stacks(self) -> int | None:
        """How many parse stacks llama.cpp holds for this grammar now (None: not readable
        on this build). Each is one way the text so far may continue; an ambiguous grammar
        (``s ::= "a" s "b" | "a" s "c"``) doubles them with every token, and llama.cpp's
        cost per token is their square, so edgespec.grammar stops a request that grows them
        past its limit."""
        return _stack_count(self._s) if self._s and _layout() else None

    def clone(self) -> "Grammar":
        return Grammar(_ll.llama_sampler_clone(self._s))

    def reset(self) -> None:
        """Back to the grammar's start (as if no token had been accepted)."""
        _ll.llama_sampler_reset(self._s)

    def close(self) -> None:
        if self._s:
            _ll.llama_sampler_free(self._s)
            self._s = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


# --- reading a grammar sampler's stack count ------------------------------------------------
# llama.cpp has no API for it, so it is read from the structs of the vendored source
# (llama.h: llama_sampler {iface, ctx}; llama-sampler.cpp: llama_sampler_grammar {vocab,
# grammar_str, grammar_root, grammar}; llama-grammar.h: llama_grammar {vocab, rules, stacks})
# with the size of the C++ standard library's std::string and std::vector. The layout is
# trusted only after probes built here read back exactly (their text, a null vocabulary,
# their known stack counts); otherwise stacks() is None and the limit is not enforced.
_PTR = ctypes.sizeof(ctypes.c_void_p)
_VECTOR = 3 * _PTR  # begin, end, capacity (libstdc++ and libc++ alike)
_layout_checked: list[int | None] = []  # [sizeof(std::string)] once probed, [None] if unusable


def _ptr(addr: int) -> int:
    return ctypes.c_void_p.from_address(addr).value or 0


def _address(handle) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _stack_count(handle, string_size: int | None = None) -> int:
    size = string_size if string_size is not None else _layout_checked[0]
    assert size is not None
    ctx = _ptr(_address(handle) + _PTR)
    grammar = _ptr(ctx + _PTR + 2 * size)
    begin, end = _ptr(grammar + _PTR + _VECTOR), _ptr(grammar + 2 * _PTR + _VECTOR)
    return (end - begin) // _VECTOR


def _layout() -> bool:
    if not _layout_checked:
        _layout_checked.append(_probe_layout())
    return _layout_checked[0] is not None


def _probe_layout() -> int | None:
    """sizeof(std::string) of the build, if the probes read back as they must."""
    if not sys.platform.startswith("linux"):  # libstdc++'s layout only (macOS's libc++
        return None                            # keeps a string's fields in another order)
    size = 32  # libstdc++: data pointer, size, 16-byte local buffer (or capacity)
    ensure_init()
    # the first probe is short enough to sit in the string's local buffer, so its data
    # pointer must point into the string itself: checked before any pointer read is followed
    probes = {'root ::= "a"': 1, 'root ::= "a" | "b" | "c"': 3, 'root ::= [a-c] "x" | "y" | "z"': 3}
    for i, (text, want) in enumerate(probes.items()):
        raw = text.encode()
        with _captured_stderr():
            h = _ll.llama_sampler_init_grammar(None, raw, b"root")
        if not h:
            return None
        try:
            ctx = _ptr(_address(h) + _PTR)
            # the probe's own text, read back through the std::string (data, size) at ctx+8
            if not ctx or _ptr(ctx) != 0:
                return None
            if ctypes.c_size_t.from_address(ctx + 2 * _PTR).value != len(raw):
                return None
            if i == 0 and _ptr(ctx + _PTR) != ctx + 3 * _PTR:
                return None
            if ctypes.string_at(_ptr(ctx + _PTR), len(raw)) != raw:
                return None
            grammar = _ptr(ctx + _PTR + 2 * size)
            if not grammar or _ptr(grammar) != 0 or _stack_count(h, size) != want:
                return None
        finally:
            _ll.llama_sampler_free(h)
    return size


def grammar_error(gbnf: str, root: str = "root") -> str | None:
    """Why llama.cpp's grammar parser refuses ``gbnf`` (None when it parses). No model needed."""
    ensure_init()
    mark = log_mark()
    with _captured_stderr() as err:  # the parser prints its reason to stderr, not to the log
        handle = _ll.llama_sampler_init_grammar(None, gbnf.encode("utf-8"), root.encode("utf-8"))
    if handle:
        _ll.llama_sampler_free(handle)
        return None
    return grammar_log_error(err.getvalue(), mark)


class _Captured:
    def __init__(self) -> None:
        self.data = b""

    def getvalue(self) -> str:
        return self.data.decode("utf-8", "replace")


class _captured_stderr:
    """File descriptor 2 into a buffer for the duration (C code writes there directly)."""

    def __enter__(self) -> _Captured:
        self.out = _Captured()
        self.tmp = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.tmp.fileno(), 2)
        return self.out

    def __exit__(self, *exc) -> None:
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.tmp.seek(0)
        self.out.data = self.tmp.read()
        self.tmp.close()


def grammar_log_error(stderr_text: str = "", mark: int | None = None) -> str:
    """The parser's reason, without the grammar it echoes after it."""
    logged = log_since(mark)
    for line in (stderr_text + "\n" + logged).splitlines():
        if "error parsing grammar: " in line:
            return line.split("error parsing grammar: ", 1)[1].strip()
    for line in logged.splitlines():
        if line.strip() and "failed to parse grammar" not in line:
            return line.strip()
    return "llama.cpp could not parse it"
