"""A loaded GGUF model (vocabulary, chat template, grammars, new contexts) and its loader."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import EdgespecError, ModelError
from . import ggml_devices
from .backend import default_threads, ensure_init, ll as _ll, recent_log, rpc_registered
from .context import Context
from .grammar_binding import Grammar, grammar_log_error
from .gguf_header import read_gguf_header
from .hugepages import Advice
from .kernel import KV_GGML_TYPE, min_pass
from .rpc import placement_key

GGML_TYPE_Q8_0 = KV_GGML_TYPE["q8_0"]


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
        self.load_mtp = False  # loaded with its NextN (MTP) layers (edgespec.runtime.mtp)
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

    #: a template that replaces the GGUF's own (EngineConfig.chat_template, --chat-template)
    _chat_template_override: str | None = None

    def use_chat_template(self, template: str) -> None:
        self._chat_template_override = template

    def chat_template(self) -> str | None:
        """The template chat prompts render with: --chat-template's, else the GGUF's own."""
        if self._chat_template_override is not None:
            return self._chat_template_override
        raw = _ll.llama_model_chat_template(self._m, None)
        return raw.decode("utf-8", "replace") if raw else None

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = _ll.llama_model_meta_val_str(self._m, key.encode(), buf, 4096)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    # grammars ----------------------------------------------------------------
    def grammar(self, gbnf: str, root: str = "root") -> Grammar:
        """A fresh llama.cpp grammar state over this vocabulary (edgespec.grammar drives it)."""
        handle = _ll.llama_sampler_init_grammar(self._vocab, gbnf.encode("utf-8"),
                                                root.encode("utf-8"))
        if not handle:
            raise EdgespecError(f"llama.cpp refused the grammar for {self.path.name}: "
                                f"{grammar_log_error()}")
        return Grammar(handle)

    # contexts ----------------------------------------------------------------
    def new_context(self, n_ctx: int, n_batch: int = 512, n_threads: int | None = None,
                    n_seq_max: int = 1, flash_attn: int = 1, type_k: int | None = None,
                    type_v: int | None = None, kv_unified: bool | None = None,
                    full_seqs: int | None = None) -> Context:
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
        advice = Advice()
        handle = _ll.llama_init_from_model(self._m, p)
        if not handle:
            raise EdgespecError(f"llama.cpp could not create a context of {n_ctx} tokens for "
                                f"{self.path.name}: {recent_log(4)}")
        # new faults (compute buffers) come huge; the KV cache llama.cpp cleared stays
        # small until khugepaged collapses it: collapsing it here costs ~0.3 s a context
        # for ~0.5% of a step (qwen-1.5b, 300 cached tokens)
        advice.mark()
        # llama.cpp may round the context up (the user's limit still holds) and clamp the batch.
        cells = int(_ll.llama_n_ctx(handle))
        return Context(self, handle, n_ctx=min(n_ctx, cells if unified else cells // n_seq_max),
                       n_batch=min(int(_ll.llama_n_batch(handle)), int(_ll.llama_n_ubatch(handle))),
                       n_threads=threads, unified=unified,
                       min_pass=min_pass(type_k, flash_attn != 0))

    def close(self) -> None:
        if not self._closed and self._m:
            _ll.llama_model_free(self._m)
            self._closed = True

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def load_model(path: str | os.PathLike, n_gpu_layers: int = 0, use_extra_bufts: bool = True,
               use_mmap: bool = True, rpc: Sequence[str] = (),
               tensor_split: Sequence[float] | None = None, load_mtp: bool = False) -> Model:
    """Load a GGUF file. The caller has already checked the header (registry.check_gguf).

    ``use_extra_bufts`` (repacked CPU weight layouts, llama.cpp's default) makes verify
    passes much cheaper (a 4-token pass ~1.7x a step instead of ~2.7x here); its kernels
    stay batch-invariant up to 3 tokens a pass, which is what exact mode verifies.

    ``rpc`` names llama.cpp RPC servers (already probed, :mod:`edgespec.runtime.rpc`): the last
    ``n_gpu_layers`` layers go to their devices, split by ``tensor_split`` (one share per
    device; llama.cpp's default splits by free memory). Without ``rpc`` a model never lands
    on an RPC server another load of this process registered.
    """
    ensure_init()
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file not found: {p}")
    # every loader, whatever its caller checked: a corrupt or hostile header is refused here,
    # before llama.cpp sizes a single allocation by it (edgespec.runtime.gguf_header)
    read_gguf_header(p)
    params = _ll.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.use_extra_bufts = use_extra_bufts
    params.load_mtp = load_mtp  # a NextN head's weights, for the mtp proposer
    if not use_mmap:
        # read the weights into RAM: repacked matrices are then not also resident as mapped
        # file pages (edgespec.planner.repack); llama.cpp's default mode maps the file
        params.load_mode = 0  # LLAMA_LOAD_MODE_NONE
    keep = []  # ctypes arrays llama.cpp reads while loading
    devices = (ggml_devices.rpc_devices(rpc) if rpc
               else ggml_devices.local_accelerators() if rpc_registered else None)
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
    # the first progress call comes once every weight buffer exists and before any is
    # written: mark them for huge pages then, so the weights fault in huge (hugepages.py)
    advice = Advice()
    if advice.on:
        marked = False  # only the first call: later ones would read /proc per tensor

        def progress(_done: float, _data: ctypes.c_void_p) -> bool:
            nonlocal marked
            if not marked:
                marked = True
                try:
                    advice.mark()
                except Exception:  # pragma: no cover - pages are an optimisation only
                    pass  # raising here would return False to llama.cpp: the load aborts
            return True
        callback = _ll.llama_progress_callback(progress)
        params.progress_callback = callback
        keep.append(callback)
    handle = _ll.llama_model_load_from_file(str(p).encode(), params)
    if not handle:
        raise ModelError(f"llama.cpp could not load {p}: {recent_log(4) or 'unknown error'}. "
                         "Check the file with `edgespec models verify`.")
    advice.mark()  # anything the loader mapped after its first progress call
    advice.collapse()  # and what it wrote before it
    model = Model(p, handle, n_gpu_layers, use_extra_bufts)
    model.rpc = tuple(rpc)
    model.load_mtp = load_mtp
    model.tensor_split = tuple(tensor_split) if tensor_split is not None else None
    return model

