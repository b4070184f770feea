"""The only module that imports llama.cpp (llama-cpp-python's ctypes API): the library itself.

It loads and initialises llama.cpp once, keeps it quiet (its log goes to a ring buffer that
error messages can quote), ends the process on a failure ggml cannot return from, and says
what the build is. The other runtime modules call llama.cpp through :data:`ll`, the module
this one imported: ``model`` (Model, load_model), ``context`` (Context and its guards),
``grammar_binding`` (llama.cpp's grammar sampler), ``ggml_devices`` (devices and RPC servers).
Everything above the runtime sees plain Python ints, bytes and numpy arrays.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from collections import deque
from typing import Any, Callable

from ..errors import EdgespecError
from .llama_build import Build
from .rpc import lost_server_message
import sys
import psutil

try:
    import llama_cpp as _ll
except Exception as e:  # pragma: no cover - install problem, reported at first use
    _ll = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None

#: llama-cpp-python's low-level module as imported here (None when it is not importable):
#: what the other runtime modules call llama.cpp through, once :func:`ensure_init` ran
ll = _ll

_init_lock = threading.Lock()
_initialised = False
_LOG: deque[str] = deque(maxlen=200)
_LOG_COUNT = [0]  # messages ever logged: what one call logged is the tail past a mark


def _require() -> None:
    if _ll is None:
        raise EdgespecError(
            f"llama-cpp-python is not importable ({_IMPORT_ERROR}); run `make install` "
            "(or pip install llama-cpp-python==0.3.36 with your CMAKE_ARGS)")


if _ll is not None:
    @_ll.llama_log_callback
    def _log_callback(level, text, user_data):  # noqa: ARG001
        try:
            _LOG.append(text.decode("utf-8", "replace"))
            _LOG_COUNT[0] += 1
        except Exception:
            pass
        if os.environ.get("EDGESPEC_LLAMA_LOG"):
            try:
                os.write(2, text)
            except Exception:
                pass


    def _close_llama_cpp_devnull() -> None:
        """llama-cpp-python opens /dev/null twice at import (``llama_cpp._utils``: where its
        constructors silence llama.cpp) and never closes it, which interpreter shutdown
        reports as two ResourceWarnings wherever they are shown (-X dev, -W error). Only
        constructors use the files, and none runs after exit handlers."""
        # deferred: a llama_cpp internal, touched only at exit
        from llama_cpp import _utils
        for f in (getattr(_utils, "outnull_file", None), getattr(_utils, "errnull_file", None)):
            try:
                if f is not None:
                    f.close()
            except Exception:
                pass

    import atexit
    atexit.register(_close_llama_cpp_devnull)


# --- aborts: failures llama.cpp cannot return from ---------------------------------------
# ggml answers one it cannot return (an RPC server gone mid-pass, a failed internal check)
# by printing its message, running gdb on the process (gdb's backtrace goes to *stdout*,
# after the generated text) and abort(). edgespec ends the process itself instead, with one
# error line; ggml's other backtrace path (an uncaught C++ exception) is switched off unless
# llama.cpp's log is asked for, when the backtrace is what the user is after.
ABORT_EXIT = 1  # what the CLI exits with for any EdgespecError
if not os.environ.get("EDGESPEC_LLAMA_LOG"):
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")


def abort_line(message: str) -> str:
    """The error line for the message ggml_abort was given (its source path shortened)."""
    msg = re.sub(r"^\S*/(?=[^/\s]+:\d+: )", "", message.strip())
    if "RPC" in msg:  # ggml-rpc.cpp: a server crashed, was stopped, or its machine went away
        return lost_server_message(tuple(rpc_registered), msg)
    return (f"llama.cpp stopped on a failure it cannot recover from ({msg}); this is a bug in "
            "llama.cpp or edgespec, not in your input: please report it with this line "
            "(EDGESPEC_LLAMA_LOG=1 adds llama.cpp's log and backtrace)")


if _ll is not None:
    @ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    def _on_ggml_abort(message):
        """ggml_abort's callback, on whichever thread failed. ggml calls abort() as soon as
        it returns, so it never does: the text generated so far is flushed, the error line
        written to stderr, and the process exits (os._exit: llama.cpp's state is broken, no
        destructor may run on it)."""
        try:
            line = abort_line((message or b"").decode("utf-8", "replace"))
        except BaseException:
            line = "llama.cpp stopped on a failure it cannot recover from"
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        try:
            os.write(2, f"Error: {line}\n".encode("utf-8", "replace"))
            if os.environ.get("EDGESPEC_LLAMA_LOG"):  # debugging llama.cpp: where it failed
                # deferred: libggml loads with the backend, not at import
                from llama_cpp import _ggml
                _ggml.libggml.ggml_print_backtrace()
        finally:
            os._exit(ABORT_EXIT)


def ensure_init() -> None:
    global _initialised
    _require()
    with _init_lock:
        if not _initialised:
            _ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            _ll.llama_backend_init()
            # deferred: libggml loads with the backend, not at import
            from llama_cpp import _ggml
            set_abort = _ggml.libggml.ggml_set_abort_callback
            set_abort.argtypes, set_abort.restype = [ctypes.c_void_p], ctypes.c_void_p
            set_abort(ctypes.cast(_on_ggml_abort, ctypes.c_void_p))
            _initialised = True


def recent_log(n: int = 8) -> str:
    return "".join(list(_LOG)[-n:]).strip()


def log_mark() -> int:
    """How many messages llama.cpp has logged so far (for :func:`log_since`)."""
    return _LOG_COUNT[0]


def log_since(mark: int | None = None) -> str:
    """What llama.cpp logged since ``log_mark()`` returned ``mark`` (None: the whole ring)."""
    n_new = len(_LOG) if mark is None else min(len(_LOG), _LOG_COUNT[0] - mark)
    return "".join(list(_LOG)[len(_LOG) - n_new:]) if n_new > 0 else ""


def system_info() -> dict:
    """Identity of the llama.cpp build, for benchmark records."""
    ensure_init()
    return {
        "llama_cpp_python": getattr(_ll, "__version__", "?"),
        "system_info": _ll.llama_print_system_info().decode("utf-8", "replace").strip(),
    }


def build_facts():
    """What this llama.cpp build is: its system info line, RPC and GPU offload support, and
    the backend devices it registered (for `edgespec doctor`)."""
    ensure_init()
    lib = ggml_lib()
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if dev:
            devices.append((lib.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace"))
    return Build(llama_cpp_python=getattr(_ll, "__version__", "?"),
                 system_info=_ll.llama_print_system_info().decode("utf-8", "replace").strip(),
                 rpc=bool(_ll.llama_supports_rpc()), gpu_offload=bool(_ll.llama_supports_gpu_offload()),
                 devices=tuple(devices))


def default_threads() -> int:
    """Physical cores when known (hyper-threads slow llama.cpp's decode), else logical ones."""
    try:
        n = psutil.cpu_count(logical=False)
    except Exception:
        n = None
    return max(1, n or os.cpu_count() or 1)


# --- libggml: the backend-device registry (edgespec.runtime.ggml_devices) -------------------
_GGML = None


def ggml_lib() -> Any:
    """libggml as llama-cpp-python loaded it, with the backend-registry calls typed once."""
    global _GGML
    ensure_init()
    if _GGML is None:
        from llama_cpp import _ggml  # the ggml library llama-cpp-python ships and already loaded

        lib = _ggml.libggml
        vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        for name, args, res in (
                ("ggml_backend_dev_count", [], sz), ("ggml_backend_dev_get", [sz], vp),
                ("ggml_backend_dev_name", [vp], cp), ("ggml_backend_dev_description", [vp], cp),
                ("ggml_backend_dev_type", [vp], ctypes.c_int),
                ("ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
                ("ggml_backend_dev_backend_reg", [vp], vp), ("ggml_backend_reg_name", [vp], cp),
                ("ggml_backend_reg_by_name", [cp], vp), ("ggml_backend_register", [vp], None),
                ("ggml_backend_reg_dev_count", [vp], sz), ("ggml_backend_reg_dev_get", [vp, sz], vp),
                ("ggml_backend_reg_get_proc_address", [vp, cp], vp),
                ("ggml_backend_dev_by_type", [ctypes.c_int], vp)):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        _GGML = lib
    return _GGML


#: RPC servers registered with llama.cpp in this process: endpoint -> its ggml_backend_reg_t
#: (edgespec.runtime.ggml_devices registers them; an abort names them)
rpc_registered: dict[str, int] = {}


# --- grammar text: llama.cpp's converters (edgespec.runtime.grammar_binding runs grammars) ---
def json_schema_to_gbnf(schema_json: str) -> str:
    """llama-cpp-python's JSON-schema-to-GBNF converter (llama.cpp's, in Python)."""
    _require()
    # deferred: the converter module only when a schema is compiled
    from llama_cpp.llama_grammar import json_schema_to_gbnf as convert
    return convert(schema_json)


def json_object_gbnf() -> str:
    """llama.cpp's grammar for any JSON object (what OpenAI-style JSON mode produces)."""
    _require()
    # deferred: the converter module only when a schema is compiled
    from llama_cpp.llama_grammar import JSON_GBNF
    return JSON_GBNF


# --- llama-cpp-python's high-level API, for the bench's anchors (edgespec.lab.bench.anchors.llama_api) --
def high_level_llama(model_path: str | os.PathLike, n_ctx: int, threads: int,
                     loaded: Any = None, **kwargs: Any) -> Any:
    """llama-cpp-python's ``Llama`` as its users load it (its ValueError or RuntimeError
    passes through: the caller says which anchor failed).

    ``loaded``: a :class:`edgespec.runtime.model.Model` of the same file, loaded as
    llama-cpp-python would load it, that the ``Llama`` computes with instead of loading the
    file a second time: one llama_model with two contexts, which llama.cpp supports, so the
    same weights and kernels without a second copy in memory. The caller closes the ``Llama``
    before the model; the ``Llama`` never frees it."""
    ensure_init()
    if loaded is None:
        return _ll.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads, **kwargs, verbose=False)
    from llama_cpp import _internals  # deferred: bench-only

    handle = loaded._m

    class _Borrowed(_internals.LlamaModel):
        """LlamaModel's state over a model loaded already, with no free on close."""

        def __init__(self, *, path_model: str, params: Any, verbose: bool = True) -> None:
            self.path_model, self.params, self.verbose = path_model, params, verbose
            self._exit_stack = contextlib.ExitStack()
            self.sampler = None
            self.custom_samplers = []
            self.model = handle
            self.vocab = _ll.llama_model_get_vocab(handle)

    # Llama.__init__ builds its model through the module attribute; swapped only for the
    # duration of this constructor, under a lock
    with _borrow_lock:
        saved = _internals.LlamaModel
        _internals.LlamaModel = _Borrowed
        try:
            return _ll.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads,
                             n_threads_batch=threads, **kwargs, verbose=False)
        finally:
            _internals.LlamaModel = saved


_borrow_lock = threading.Lock()


def prompt_lookup_decoding() -> type:
    """llama-cpp-python's ``LlamaPromptLookupDecoding`` class."""
    ensure_init()
    # deferred: bench-only, only when the anchor is built
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    return LlamaPromptLookupDecoding


def ram_cache(capacity_bytes: int) -> Any:
    """llama-cpp-python's ``LlamaRAMCache``."""
    return _ll.LlamaRAMCache(capacity_bytes=capacity_bytes)


def eog_test(llm: Any) -> Callable[[int], bool]:
    """Whether a token ends generation in the vocabulary of a high-level ``Llama``."""
    vocab = _ll.llama_model_get_vocab(llm.model)
    return lambda tok: bool(_ll.llama_vocab_is_eog(vocab, tok))
