"""The only module that touches llama.cpp (through llama-cpp-python's ctypes API).

Everything above this layer sees plain Python ints, bytes and numpy arrays. The
module keeps llama.cpp quiet (its log goes to a ring buffer that error messages
can quote) and turns every failure into an EdgespecError.
"""
from __future__ import annotations

import ctypes
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ContextOverflowError, EdgespecError, ModelError
from .build import Build
from .rpc import lost_server_message, placement_key

try:
    import llama_cpp as _ll
except Exception as e:  # pragma: no cover - install problem, reported at first use
    _ll = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None

GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8

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
        return lost_server_message(tuple(_RPC_REGS), msg)
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
            import sys
            sys.stdout.flush()
        except BaseException:
            pass
        try:
            os.write(2, f"Error: {line}\n".encode("utf-8", "replace"))
            if os.environ.get("EDGESPEC_LLAMA_LOG"):  # debugging llama.cpp: where it failed
                from llama_cpp import _ggml
                _ggml.libggml.ggml_print_backtrace()
        finally:
            os._exit(ABORT_EXIT)


def _ensure_init() -> None:
    global _initialised
    _require()
    with _init_lock:
        if not _initialised:
            _ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            _ll.llama_backend_init()
            from llama_cpp import _ggml
            set_abort = _ggml.libggml.ggml_set_abort_callback
            set_abort.argtypes, set_abort.restype = [ctypes.c_void_p], ctypes.c_void_p
            set_abort(ctypes.cast(_on_ggml_abort, ctypes.c_void_p))
            _initialised = True


def recent_log(n: int = 8) -> str:
    return "".join(list(_LOG)[-n:]).strip()


def system_info() -> dict:
    """Identity of the llama.cpp build, for benchmark records."""
    _ensure_init()
    return {
        "llama_cpp_python": getattr(_ll, "__version__", "?"),
        "system_info": _ll.llama_print_system_info().decode("utf-8", "replace").strip(),
    }


def build_facts():
    """What this llama.cpp build is: its system info line, RPC and GPU offload support, and
    the backend devices it registered (for `edgespec doctor`)."""
    _ensure_init()
    lib = _ggml_lib()
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if dev:
            devices.append((lib.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace"))
    return Build(llama_cpp_python=getattr(_ll, "__version__", "?"),
                 system_info=_ll.llama_print_system_info().decode("utf-8", "replace").strip(),
                 rpc=bool(_ll.llama_supports_rpc()), gpu_offload=bool(_ll.llama_supports_gpu_offload()),
                 devices=tuple(devices))


# --- model -------------------------------------------------------------------
class Model:
    """A loaded GGUF model: vocabulary, chat template, contexts."""

    def __init__(self, path: Path, handle, n_gpu_layers: int, use_extra_bufts: bool) -> None:
        self.path = path
        self._m = handle
        self._vocab = _ll.llama_model_get_vocab(handle)
        self.n_vocab = int(_ll.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(_ll.llama_model_n_ctx_train(handle))
        self.n_layer = int(_ll.llama_model_n_layer(handle))
        self.n_embd = int(_ll.llama_model_n_embd(handle))
        self.size_bytes = int(_ll.llama_model_size(handle))
        self.n_gpu_layers = n_gpu_layers
        self.use_extra_bufts = use_extra_bufts
        self.rpc: tuple[str, ...] = ()  # RPC servers holding some layers (load_model)
        self.tensor_split: tuple[float, ...] | None = None
        self.bos = int(_ll.llama_vocab_bos(self._vocab))
        self.eos = int(_ll.llama_vocab_eos(self._vocab))
        self.add_bos = bool(_ll.llama_vocab_get_add_bos(self._vocab))
        buf = ctypes.create_string_buffer(256)
        n = _ll.llama_model_desc(handle, buf, 256)
        self.description = buf.value[: max(n, 0)].decode("utf-8", "replace")
        self._eog = np.array([bool(_ll.llama_vocab_is_eog(self._vocab, t))
                              for t in range(self.n_vocab)], dtype=bool)
        self._piece_cache: dict[int, bytes] = {}
        self._closed = False

    @property
    def placement(self) -> str:
        """Where the layers run, for caches keyed by it ('' = all on this machine)."""
        return placement_key(self.rpc, self.n_gpu_layers, self.tensor_split)

    # vocabulary ------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (_ll.llama_token * cap)()
        n = _ll.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (_ll.llama_token * cap)()
            n = _ll.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            raise EdgespecError(f"tokenization failed ({n})")
        return list(arr[:n])

    def token_piece(self, token: int, special: bool = False) -> bytes:
        """Raw bytes of one token (control tokens render empty unless special=True)."""
        key = token if not special else -token - 1
        piece = self._piece_cache.get(key)
        if piece is None:
            if not 0 <= token < self.n_vocab:
                raise EdgespecError(f"token id {token} outside the vocabulary (0..{self.n_vocab - 1})")
            buf = ctypes.create_string_buffer(64)
            n = _ll.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = _ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
            piece = buf.raw[:n]
            self._piece_cache[key] = piece
        return piece

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        return b"".join(self.token_piece(t, special) for t in tokens)

    def token_text(self, token: int) -> str:
        """The vocabulary entry's own text (as stored in the GGUF), for compatibility checks."""
        raw = _ll.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw is not None else ""

    def token_attr(self, token: int) -> int:
        return int(_ll.llama_vocab_get_attr(self._vocab, token))

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token]) if 0 <= token < self.n_vocab else False

    @property
    def eog_tokens(self) -> list[int]:
        return [int(t) for t in np.flatnonzero(self._eog)]

    def chat_template(self) -> str | None:
        raw = _ll.llama_model_chat_template(self._m, None)
        return raw.decode("utf-8", "replace") if raw else None

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = _ll.llama_model_meta_val_str(self._m, key.encode(), buf, 4096)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    # grammars ----------------------------------------------------------------
    def grammar(self, gbnf: str, root: str = "root") -> "Grammar":
        """A fresh llama.cpp grammar state over this vocabulary (edgespec.grammar drives it)."""
        handle = _ll.llama_sampler_init_grammar(self._vocab, gbnf.encode("utf-8"),
                                                root.encode("utf-8"))
        if not handle:
            raise EdgespecError(f"llama.cpp refused the grammar for {self.path.name}: "
                                f"{_grammar_log_error()}")
        return Grammar(handle)

    # contexts ----------------------------------------------------------------
    def new_context(self, n_ctx: int, n_batch: int = 512, n_threads: int | None = None,
                    n_seq_max: int = 1, flash_attn: int = 1, type_k: int | None = None,
                    type_v: int | None = None, kv_unified: bool | None = None,
                    full_seqs: int | None = None) -> "Context":
        """A context whose kernels give a position the same logits alone or in a small batch.

        Flash attention on with a Q8_0 KV cache: with an F16 cache, single-token decodes
        over more than a few hundred cached tokens take ggml-cpu's split-KV attention path,
        which no batch takes, so plain and speculative logits drift apart (docs/parity.md).
        """
        type_k = GGML_TYPE_Q8_0 if type_k is None else type_k
        type_v = GGML_TYPE_Q8_0 if type_v is None else type_v
        if n_ctx <= 0:
            raise EdgespecError(f"context size must be positive (got {n_ctx})")
        threads = n_threads or default_threads()
        n_batch = max(1, min(n_batch, n_ctx))
        p = _ll.llama_context_default_params()
        # unified (the default with several sequences): one cell pool, so a step that mixes
        # sequences with different numbers of rows (a draft here, a single token there) is
        # one graph; a split cache cuts it into micro-batches of equal rows per sequence.
        # But in a shared pool a sequence's cells fill the holes others' rejected drafts
        # left, out of position order, and attention sums them in cell order: the logits
        # move by rounding (docs/parity.md). Split streams keep each sequence's cells in
        # order, bitwise as alone: what exact mode needs.
        unified = n_seq_max > 1 if kv_unified is None else bool(kv_unified and n_seq_max > 1)
        # n_ctx is each sequence's limit; sequences past ``full_seqs`` (draft-tree scratch
        # sequences, unified pools only) share cells and add at most a batch of their own
        full = n_seq_max if full_seqs is None or not unified else max(1, min(full_seqs, n_seq_max))
        p.n_ctx = n_ctx * full + (n_seq_max - full) * n_batch
        p.n_batch = n_batch
        p.n_ubatch = n_batch
        p.n_seq_max = n_seq_max
        p.kv_unified = unified
        p.n_threads = threads
        p.n_threads_batch = threads
        p.flash_attn_type = flash_attn
        p.no_perf = True
        p.type_k = type_k
        p.type_v = type_v
        handle = _ll.llama_init_from_model(self._m, p)
        if not handle:
            raise EdgespecError(f"llama.cpp could not create a context of {n_ctx} tokens for "
                                f"{self.path.name}: {recent_log(4)}")
        # llama.cpp may round the context up (the user's limit still holds) and clamp the batch.
        cells = int(_ll.llama_n_ctx(handle))
        return Context(self, handle, n_ctx=min(n_ctx, cells if unified else cells // n_seq_max),
                       n_batch=min(int(_ll.llama_n_batch(handle)), int(_ll.llama_n_ubatch(handle))),
                       n_threads=threads, unified=unified)

    def close(self) -> None:
        if not self._closed and self._m:
            _ll.llama_model_free(self._m)
            self._closed = True

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def default_threads() -> int:
    """Physical cores when known (hyper-threads slow llama.cpp's decode), else logical ones."""
    try:
        import psutil
        n = psutil.cpu_count(logical=False)
    except Exception:
        n = None
    return max(1, n or os.cpu_count() or 1)


def load_model(path: str | os.PathLike, n_gpu_layers: int = 0, use_extra_bufts: bool = True,
               use_mmap: bool = True, rpc: Sequence[str] = (),
               tensor_split: Sequence[float] | None = None) -> Model:
    """Load a GGUF file. The caller has already checked the header (registry.check_gguf).

    ``use_extra_bufts`` (repacked CPU weight layouts, llama.cpp's default) makes verify
    passes much cheaper (a 4-token pass ~1.7x a step instead of ~2.7x here); its kernels
    stay batch-invariant up to 3 tokens a pass, which is what exact mode verifies.

    ``rpc`` names llama.cpp RPC servers (already probed, :mod:`edgespec.runtime.rpc`): the last
    ``n_gpu_layers`` layers go to their devices, split by ``tensor_split`` (one share per
    device; llama.cpp's default splits by free memory). Without ``rpc`` a model never lands
    on an RPC server another load of this process registered.
    """
    _ensure_init()
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file not found: {p}")
    params = _ll.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.use_extra_bufts = use_extra_bufts
    if not use_mmap:
        # read the weights into RAM: repacked matrices are then not also resident as mapped
        # file pages (edgespec.planner.repack); llama.cpp's default mode maps the file
        params.load_mode = 0  # LLAMA_LOAD_MODE_NONE
    keep = []  # ctypes arrays llama.cpp reads while loading
    devices = rpc_devices(rpc) if rpc else (_local_accelerators() if _RPC_REGS else None)
    if devices is not None:
        arr = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)  # NULL-terminated
        params.devices = ctypes.cast(arr, ctypes.c_void_p).value
        keep.append(arr)
    if tensor_split is not None:
        n_max = int(_ll.llama_max_devices())
        if devices is None or len(tensor_split) != len(devices) or len(devices) > n_max:
            raise EdgespecError(f"--tensor-split gives {len(tensor_split)} shares for "
                                f"{len(devices or ())} devices")
        split = (ctypes.c_float * n_max)(*[float(x) for x in tensor_split])
        params.tensor_split = split
        keep.append(split)
    handle = _ll.llama_model_load_from_file(str(p).encode(), params)
    if not handle:
        raise ModelError(f"llama.cpp could not load {p}: {recent_log(4) or 'unknown error'}. "
                         "Check the file with `edgespec models verify`.")
    model = Model(p, handle, n_gpu_layers, use_extra_bufts)
    model.rpc = tuple(rpc)
    model.tensor_split = tuple(tensor_split) if tensor_split is not None else None
    return model


# --- context -----------------------------------------------------------------
def check_decode(n: int, pos0: int, n_ctx: int, n_batch: int, logits: str) -> None:
    """The guards every Context.decode applies (shared with the test fakes)."""
    if n == 0:
        raise EdgespecError("decode called with no tokens")
    if pos0 < 0 or pos0 + n > n_ctx:
        raise ContextOverflowError(
            f"positions {pos0}..{pos0 + n - 1} exceed the context of {n_ctx} tokens; "
            "raise --ctx or shorten the prompt")
    if logits == "all" and n > n_batch:
        raise EdgespecError(f"all-position logits need at most n_batch={n_batch} tokens")


def check_multi(segments, n_ctx: int, n_batch: int) -> None:
    """The guards of Context.decode_multi (shared with the test fakes)."""
    if not segments:
        raise EdgespecError("decode_multi called with no sequences")
    seen = set()
    for tokens, pos0, seq_id, logits in segments:
        check_decode(len(tokens), pos0, n_ctx, n_batch, logits)
        if seq_id in seen:
            raise EdgespecError(f"sequence {seq_id} appears twice in one step")
        seen.add(seq_id)
    total = sum(len(t) for t, *_ in segments)
    if total > n_batch:
        raise EdgespecError(f"a step of {total} tokens exceeds n_batch={n_batch}")


class Context:
    """One llama.cpp context: a KV cache with sequences, and batched decoding."""

    def __init__(self, model: Model, handle, n_ctx: int, n_batch: int, n_threads: int,
                 unified: bool = False) -> None:
        self.model = model
        self._c = handle
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_threads = n_threads
        self.n_seq_max = int(_ll.llama_n_seq_max(handle))
        self.unified = self.n_seq_max > 1 and bool(unified)
        self._mem = _ll.llama_get_memory(handle)
        self._batch_cap = n_batch
        self._batch = _ll.llama_batch_init(n_batch, 0, 1)
        self._closed = False

    def _run_batch(self, b, n: int, what: str = "") -> None:
        """Evaluate the first ``n`` entries of batch ``b`` (every decode ends here)."""
        b.n_tokens = n
        rc = _ll.llama_decode(self._c, b)
        if rc != 0:
            raise EdgespecError(f"llama_decode{what} failed with status {rc}"
                                f"{' (KV cache full)' if rc == 1 else ''}: {recent_log(3)}")

    def decode(self, tokens: Sequence[int], pos0: int, seq_id: int = 0,
               logits: str = "last") -> np.ndarray:
        """Evaluate ``tokens`` at positions pos0.. in sequence ``seq_id``.

        Returns a float32 copy of the logits: shape (1, n_vocab) for "last",
        (len(tokens), n_vocab) for "all", (0, n_vocab) for "none". Inputs longer
        than n_batch are split; only the final chunk can carry logits.
        """
        n = len(tokens)
        check_decode(n, pos0, self.n_ctx, self.n_batch, logits)
        nv = self.model.n_vocab
        out = None
        start = 0
        while start < n:
            chunk = tokens[start:start + self.n_batch]
            last_chunk = start + len(chunk) >= n
            b = self._batch
            for i, t in enumerate(chunk):
                b.token[i] = int(t)
                b.pos[i] = pos0 + start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq_id
                want = last_chunk and (logits == "all" or (logits == "last" and i == len(chunk) - 1))
                b.logits[i] = 1 if want else 0
            self._run_batch(b, len(chunk))
            if last_chunk and logits != "none":
                rows = len(chunk) if logits == "all" else 1
                ptr = _ll.llama_get_logits(self._c)
                out = np.ctypeslib.as_array(ptr, shape=(rows, nv)).copy()
            start += len(chunk)
        if out is None:
            out = np.zeros((0, nv), dtype=np.float32)
        return out

    def decode_multi(self, segments: Sequence[tuple[Sequence[int], int, int, str]]
                     ) -> list[np.ndarray]:
        """One ``llama_decode`` over several sequences: ``segments`` are
        (tokens, pos0, seq_id, logits) with ``logits`` "all", "last" or "none" as in
        :meth:`decode`. Returns each segment's logits rows, in order. The whole step must
        fit one batch (the scheduler sizes it so)."""
        check_multi(segments, self.n_ctx, self.n_batch)
        nv = self.model.n_vocab
        b = self._batch
        i = 0
        wanted: list[int] = []
        for tokens, pos0, seq_id, logits in segments:
            n = len(tokens)
            for j, t in enumerate(tokens):
                b.token[i] = int(t)
                b.pos[i] = pos0 + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq_id
                want = logits == "all" or (logits == "last" and j == n - 1)
                b.logits[i] = 1 if want else 0
                i += 1
            wanted.append(n if logits == "all" else 1 if logits == "last" else 0)
        self._run_batch(b, i)
        total = sum(wanted)
        out: list[np.ndarray] = []
        if total:
            ptr = _ll.llama_get_logits(self._c)
            rows = np.ctypeslib.as_array(ptr, shape=(total, nv))
        at = 0
        for w in wanted:
            out.append(rows[at:at + w].copy() if w else np.zeros((0, nv), dtype=np.float32))
            at += w
        return out

    def trim(self, seq_id: int, from_pos: int) -> None:
        """Drop every cached position >= from_pos of a sequence (rejected drafts)."""
        ok = _ll.llama_memory_seq_rm(self._mem, seq_id, from_pos, -1)
        if not ok:
            raise EdgespecError(f"could not trim sequence {seq_id} from position {from_pos}")

    def clear(self) -> None:
        _ll.llama_memory_clear(self._mem, True)

    # per-sequence state: what edgespec.decoding.kvcache keeps in RAM and edgespec.chat.sessions on disk
    def state_get(self, seq_id: int = 0) -> bytes:
        """A copy of one sequence's KV state (llama.cpp's versioned sequence format)."""
        size = int(_ll.llama_state_seq_get_size(self._c, seq_id))
        buf = (ctypes.c_uint8 * max(size, 1))()
        n = int(_ll.llama_state_seq_get_data(self._c, buf, size, seq_id))
        if n == 0 and size:
            raise EdgespecError(f"llama.cpp could not copy the state of sequence {seq_id}: "
                                f"{recent_log(3)}")
        return bytes(memoryview(buf)[:n])

    def state_set(self, state: bytes, seq_id: int = 0) -> None:
        """Replace sequence ``seq_id`` with a state from :meth:`state_get` of a context of the
        same model and configuration; on failure the sequence is left empty."""
        self.trim(seq_id, 0)
        buf = (ctypes.c_uint8 * max(len(state), 1)).from_buffer_copy(state or b"\0")
        n = int(_ll.llama_state_seq_set_data(self._c, buf, len(state), seq_id))
        if n == 0:
            self.trim(seq_id, 0)
            raise EdgespecError(f"llama.cpp refused a saved state for sequence {seq_id} "
                                f"({len(state)} bytes): {recent_log(3)}")

    def seq_pos_max(self, seq_id: int = 0) -> int:
        """The last position sequence ``seq_id`` holds (-1 when empty)."""
        return int(_ll.llama_memory_seq_pos_max(self._mem, seq_id))

    def close(self) -> None:
        if not self._closed:
            _ll.llama_batch_free(self._batch)
            _ll.llama_free(self._c)
            self._closed = True

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass

    # --- draft trees (edgespec.decoding.tree): one pass over several branches ------------------
    def decode_tree(self, tokens: Sequence[int], positions: Sequence[int],
                    seq_ids_per_token: Sequence[Sequence[int]],
                    logits_mask: Sequence[bool]) -> np.ndarray:
        """One ``llama_decode`` where each token belongs to the sequences listed for it
        (a draft tree's shared prefix to several), so each attends to exactly the cached
        tokens of its sequences. Sequences that share a token must hold the same cells
        before the call (``seq_cp`` the prefix first). Returns the logits of the tokens
        whose mask is true, in order. Needs a context with ``n_seq_max`` > 1 (its KV
        pool is then unified, which coupled sequences require)."""
        check_tree(tokens, positions, seq_ids_per_token, logits_mask, self.n_ctx,
                   self.n_batch, self.n_seq_max)
        b = self._tree_batch_for()
        for i, (t, pos, seqs, want) in enumerate(zip(tokens, positions, seq_ids_per_token,
                                                     logits_mask)):
            b.token[i] = int(t)
            b.pos[i] = int(pos)
            b.n_seq_id[i] = len(seqs)
            for j, s in enumerate(seqs):
                b.seq_id[i][j] = int(s)
            b.logits[i] = 1 if want else 0
        self._run_batch(b, len(tokens), " of a draft tree")
        rows = sum(1 for w in logits_mask if w)
        if not rows:
            return np.zeros((0, self.model.n_vocab), dtype=np.float32)
        ptr = _ll.llama_get_logits(self._c)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.model.n_vocab)).copy()

    def _tree_batch_for(self):
        b = getattr(self, "_tree_batch", None)
        if b is None:
            import weakref
            b = self._tree_batch = _ll.llama_batch_init(self.n_batch, 0, self.n_seq_max)
            weakref.finalize(self, _ll.llama_batch_free, b)
        return b

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Sequence ``dst`` also holds ``src``'s cells at positions ``p0 .. p1 - 1``
        (p1 = -1: to the end). In a unified pool this marks cells, it copies nothing."""
        self._check_seq(src)
        self._check_seq(dst)
        if not self.unified:
            # llama.cpp asserts (aborts the process) on a partial copy in a split pool
            raise EdgespecError("seq_cp needs a context whose sequences share one KV pool "
                                "(n_seq_max > 1, unified: not an exact-mode engine)")
        _ll.llama_memory_seq_cp(self._mem, int(src), int(dst), int(p0), int(p1))

    def seq_keep(self, seq_id: int) -> None:
        """Drops every sequence but ``seq_id`` (all of the context: only for a context that
        serves one request)."""
        self._check_seq(seq_id)
        _ll.llama_memory_seq_keep(self._mem, int(seq_id))

    def _check_seq(self, seq_id: int) -> None:
        if not 0 <= int(seq_id) < self.n_seq_max:
            raise EdgespecError(f"sequence {seq_id} outside 0..{self.n_seq_max - 1}: the context "
                                f"was created with n_seq_max={self.n_seq_max}")


# --- grammars: llama.cpp's own grammar engine --------------------------------------
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
    _ensure_init()
    mark = _LOG_COUNT[0]
    with _captured_stderr() as err:  # the parser prints its reason to stderr, not to the log
        handle = _ll.llama_sampler_init_grammar(None, gbnf.encode("utf-8"), root.encode("utf-8"))
    if handle:
        _ll.llama_sampler_free(handle)
        return None
    return _grammar_log_error(err.getvalue(), mark)


class _Captured:
    def __init__(self) -> None:
        self.data = b""

    def getvalue(self) -> str:
        return self.data.decode("utf-8", "replace")


class _captured_stderr:
    """File descriptor 2 into a buffer for the duration (C code writes there directly)."""

    def __enter__(self) -> _Captured:
        import tempfile
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


def _grammar_log_error(stderr_text: str = "", mark: int | None = None) -> str:
    """The parser's reason, without the grammar it echoes after it."""
    n_new = len(_LOG) if mark is None else min(len(_LOG), _LOG_COUNT[0] - mark)
    logged = "".join(list(_LOG)[len(_LOG) - n_new:]) if n_new > 0 else ""
    for line in (stderr_text + "\n" + logged).splitlines():
        if "error parsing grammar: " in line:
            return line.split("error parsing grammar: ", 1)[1].strip()
    for line in logged.splitlines():
        if line.strip() and "failed to parse grammar" not in line:
            return line.strip()
    return "llama.cpp could not parse it"


def json_schema_to_gbnf(schema_json: str) -> str:
    """llama-cpp-python's JSON-schema-to-GBNF converter (llama.cpp's, in Python)."""
    _require()
    from llama_cpp.llama_grammar import json_schema_to_gbnf as convert
    return convert(schema_json)


def json_object_gbnf() -> str:
    """llama.cpp's grammar for any JSON object (what OpenAI-style JSON mode produces)."""
    _require()
    from llama_cpp.llama_grammar import JSON_GBNF
    return JSON_GBNF


# --- benchmark anchor: llama-cpp-python's own speculation -----------------------------
@dataclass(frozen=True)
class AnchorTrace:
    """What one anchor generation observed (edgespec.bench.anchor turns it into RequestStats)."""

    prompt_tokens: int
    tokens: tuple[int, ...]  # emitted tokens, end-of-generation token excluded
    token_times: tuple[float, ...]  # seconds since start at which each yielded token came out
    passes: tuple[tuple[int, int], ...]  # per decode pass: (sequence length before it, drafted)
    first_token_seconds: float  # prompt evaluation + first sample
    total_seconds: float
    stop_reason: str  # "eos" | "length"
    eog_time: float | None = None  # when the end-of-generation token came out, if it did


class PromptLookupAnchor:
    """llama-cpp-python's high-level ``Llama`` with ``LlamaPromptLookupDecoding``, as users run it
    today, traced for the benchmark (see edgespec.bench.anchor for how the trace is read)."""

    def __init__(self, llm, lookup, passes: list) -> None:
        self._llm = llm
        self._lookup = lookup
        self._passes = passes  # the lookup appends (sequence length, drafted) on every call
        self._vocab = _ll.llama_model_get_vocab(llm.model)
        self.n_ctx = llm.n_ctx()
        self.num_pred_tokens = lookup.num_pred_tokens

    def generate(self, prompt_tokens: Sequence[int], max_tokens: int, temperature: float = 0.0):
        import time

        if len(prompt_tokens) + max_tokens + 1 > self.n_ctx:
            raise ContextOverflowError(
                f"the anchor's context holds {self.n_ctx} tokens, the request needs "
                f"{len(prompt_tokens) + max_tokens + 1}")
        self._passes.clear()
        self._llm.reset()  # no prefix reuse between requests: every request prefills, as ours do
        tokens: list[int] = []
        times: list[float] = []
        eog_time = None
        first = None
        t0 = time.perf_counter()
        gen = self._llm.generate(list(prompt_tokens), temp=temperature, top_k=0, top_p=1.0,
                                 min_p=0.0, repeat_penalty=1.0, reset=True)
        try:
            for tok in gen:
                now = time.perf_counter() - t0
                first = now if first is None else first
                if _ll.llama_vocab_is_eog(self._vocab, tok):
                    eog_time = now
                    break
                tokens.append(int(tok))
                times.append(now)
                if len(tokens) >= max_tokens:
                    break
        except (ValueError, RuntimeError) as e:
            # one failed anchor request is a recorded error, not the end of a benchmark
            raise EdgespecError(f"llama-cpp-python's prompt lookup failed: {e}") from None
        finally:
            gen.close()
        total = time.perf_counter() - t0
        return AnchorTrace(prompt_tokens=len(prompt_tokens), tokens=tuple(tokens),
                           token_times=tuple(times), passes=tuple(self._passes),
                           first_token_seconds=first if first is not None else total,
                           total_seconds=total, stop_reason="eos" if eog_time is not None else "length",
                           eog_time=eog_time)

    def close(self) -> None:
        self._llm.close()


def anchor_prompt_lookup(model_path: str | os.PathLike, n_ctx: int, threads: int | None,
                         num_pred_tokens: int = 10, max_ngram_size: int = 2) -> PromptLookupAnchor:
    """Load the anchor. It keeps logits for every position of its context (n_ctx x n_vocab
    floats, 1.2 GiB at 2048 tokens for Qwen's vocabulary), so keep n_ctx modest."""
    _ensure_init()
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    passes: list[tuple[int, int]] = []

    class _Traced(LlamaPromptLookupDecoding):
        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            passes.append((int(input_ids.shape[0]), int(draft.shape[0])))
            return draft

    threads = threads or default_threads()
    lookup = _Traced(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
    try:
        # logits_all=True by hand: with only draft_model set, Llama sizes its logits buffer
        # for n_batch rows but writes every prompt row, and fails on prompts over n_batch.
        llm = _ll.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads,
                        n_threads_batch=threads, draft_model=lookup, logits_all=True,
                        verbose=False)
    except (ValueError, RuntimeError) as e:
        raise ModelError(f"llama-cpp-python could not load {model_path} for the prompt-lookup "
                         f"anchor: {e}") from None
    return PromptLookupAnchor(llm, lookup, passes)


# --- devices -----------------------------------------------------------------
_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type


_GGML = None


def _ggml_lib():
    """libggml as llama-cpp-python loaded it, with the backend-registry calls typed once."""
    global _GGML
    _ensure_init()
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


def list_devices() -> list[dict]:
    """The compute devices this llama.cpp build can use, without loading a model.

    Plain dicts: ``name``, ``description``, ``type`` ("cpu", "gpu", "igpu",
    "accel"), ``free`` and ``total`` memory in bytes (for the CPU device, host RAM).
    A build without GPU/Metal/Vulkan backends lists the CPU only; RPC servers added by
    :func:`rpc_devices` are left out (they are not this machine's).
    """
    lib = _ggml_lib()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if not dev or _is_rpc(lib, dev):
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append({
            "name": (lib.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace"),
            "description": (lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
            "type": _DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
            "free": int(free.value),
            "total": int(total.value),
        })
    return out


# --- RPC: layers on other machines (edgespec.runtime.rpc) ------------------------------------
_RPC_REGS: dict[str, int] = {}  # endpoint -> its registered ggml_backend_reg_t


def _is_rpc(lib, dev) -> bool:
    reg = lib.ggml_backend_dev_backend_reg(dev)
    return bool(reg) and (lib.ggml_backend_reg_name(reg) or b"").startswith(b"RPC")


def rpc_supported() -> bool:
    """Whether this llama.cpp was built with GGML_RPC."""
    _ensure_init()
    return bool(_ll.llama_supports_rpc())


def require_rpc() -> None:
    if not rpc_supported():
        raise EdgespecError(
            "this llama.cpp was built without the RPC backend: reinstall it with -DGGML_RPC=ON "
            "(`make install` does; with your own CMAKE_ARGS, add -DGGML_RPC=ON to them)")


def _rpc_proc(name: str):
    lib = _ggml_lib()
    require_rpc()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    addr = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not addr:  # pragma: no cover - a GGML_RPC build always has both
        raise EdgespecError(f"llama.cpp's RPC backend has no {name}")
    return addr


def rpc_devices(endpoints: Sequence[str]) -> list[int]:
    """The devices of these RPC servers, in order, registered with llama.cpp once each.

    Probe every endpoint first (:func:`edgespec.runtime.rpc.probe`): llama.cpp aborts the process
    when a server cannot be reached, and it connects here."""
    lib = _ggml_lib()
    add = None
    out: list[int] = []
    for ep in endpoints:
        reg = _RPC_REGS.get(ep)
        if reg is None:
            add = add or ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
                _rpc_proc("ggml_backend_rpc_add_server"))
            reg = add(ep.encode())
            if not reg:
                raise EdgespecError(f"RPC server {ep} reports no devices")
            lib.ggml_backend_register(reg)
            _RPC_REGS[ep] = reg
        out += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg))]
    return out


def _local_accelerators() -> list[int]:
    """This machine's GPU devices, what llama.cpp's default device choice would take when no
    RPC server had been registered in this process."""
    lib = _ggml_lib()
    devs = (lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count()))
    return [d for d in devs if d and lib.ggml_backend_dev_type(d) in (1, 2) and not _is_rpc(lib, d)]


def serve_rpc(endpoint: str, n_threads: int, cache_dir: str | None = None) -> None:
    """Serve this machine's CPU to RPC clients at ``endpoint``; returns only when llama.cpp's
    server loop does (it could not listen). Run it in a thread of its own process."""
    lib = _ggml_lib()
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                             ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))(
        _rpc_proc("ggml_backend_rpc_start_server"))
    cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not cpu:  # pragma: no cover
        raise EdgespecError("llama.cpp reports no CPU device")
    devices = (ctypes.c_void_p * 1)(cpu)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, 1, devices)


def check_tree(tokens, positions, seq_ids_per_token, logits_mask, n_ctx: int, n_batch: int,
               n_seq_max: int) -> None:
    """The guards of Context.decode_tree (shared with the test fakes)."""
    n = len(tokens)
    if n == 0:
        raise EdgespecError("decode_tree called with no tokens")
    if not len(positions) == len(seq_ids_per_token) == len(logits_mask) == n:
        raise EdgespecError(f"decode_tree needs one position, one sequence list and one logits "
                            f"flag per token ({n} tokens, {len(positions)} positions, "
                            f"{len(seq_ids_per_token)} sequence lists, {len(logits_mask)} flags)")
    if n > n_batch:
        raise EdgespecError(f"a tree of {n} tokens exceeds n_batch={n_batch}")
    if n_seq_max < 2 and any(len(s) != 1 for s in seq_ids_per_token):
        raise EdgespecError("a token in several sequences needs a context with n_seq_max > 1")
    for pos, seqs in zip(positions, seq_ids_per_token):
        if not 0 <= pos < n_ctx:
            raise ContextOverflowError(f"position {pos} exceeds the context of {n_ctx} tokens; "
                                       "raise --ctx or shorten the prompt")
        if not seqs or len(set(seqs)) != len(seqs) or \
                any(not 0 <= s < n_seq_max for s in seqs):
            raise EdgespecError(f"each token needs distinct sequence ids in 0..{n_seq_max - 1} "
                                f"(got {tuple(seqs)})")


# --- benchmark anchor: llama-cpp-python's prompt cache across conversation turns ----------
class RamCacheAnchor:
    """llama-cpp-python's high-level ``Llama`` with ``LlamaRAMCache``, the prompt cache its users
    reuse a conversation's KV with, for tools/bench_turn2.py. ``complete`` streams a
    completion of a token prompt and returns (text, seconds to the first token, seconds in
    all); ``reset`` forgets the context's own tokens, so the next prompt's prefix can come
    only from the RAM cache."""

    def __init__(self, llm, cache) -> None:
        self._llm, self.cache = llm, cache

    def complete(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[str, float, float]:
        import time

        t0 = time.perf_counter()
        first, pieces = None, []
        try:
            for chunk in self._llm.create_completion(prompt=list(prompt_tokens),
                                                     max_tokens=max_tokens, temperature=0.0,
                                                     top_k=1, repeat_penalty=1.0, stream=True):
                first = time.perf_counter() - t0 if first is None else first
                pieces.append(chunk["choices"][0]["text"])
        except (ValueError, RuntimeError) as e:
            raise EdgespecError(f"llama-cpp-python's completion failed: {e}") from None
        total = time.perf_counter() - t0
        return "".join(pieces), first if first is not None else total, total

    def reset(self) -> None:
        self._llm.reset()

    def close(self) -> None:
        self._llm.close()


def anchor_ram_cache_llama(model_path: str | os.PathLike, n_ctx: int, threads: int | None,
                           capacity_bytes: int = 2 << 30) -> RamCacheAnchor:
    """Load the RAM-cache anchor (its own context of ``n_ctx`` tokens, beside the engine's)."""
    _ensure_init()
    threads = threads or default_threads()
    try:
        llm = _ll.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads,
                        n_threads_batch=threads, verbose=False)
    except (ValueError, RuntimeError) as e:
        raise ModelError(f"llama-cpp-python could not load {model_path} for the RAM-cache "
                         f"anchor: {e}") from None
    cache = _ll.LlamaRAMCache(capacity_bytes=capacity_bytes)
    llm.set_cache(cache)
    return RamCacheAnchor(llm, cache)
