"""llama.cpp's own grammar engine, bound: a grammar sampler over a model's vocabulary
(edgespec.grammar drives it) and the parser's verdict on a grammar text, no model needed."""
from __future__ import annotations

import ctypes
import os

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
