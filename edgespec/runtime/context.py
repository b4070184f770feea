"""One llama.cpp context: a KV cache with sequences, and batched decoding (plain, several
sequences in one step, draft trees), with the guards every decode applies (the test fakes
apply the same ones)."""
from __future__ import annotations

import ctypes
from typing import Callable, Protocol, Sequence

import numpy as np

from ..errors import ContextOverflowError, EdgespecError
from .backend import ll as _ll, recent_log
from .kernel import MIN_PASS, pass_sizes
import weakref


class ModelShape(Protocol):
    """What a context reads of the model it was made from. edgespec.runtime.model.Model
    makes contexts and passes itself; this is all a context (and the heads built on one:
    mtp.py, eagle3.py) asks of it, so the arrow runs from the model to the context only."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_embd(self) -> int: ...

    @property
    def n_layer(self) -> int: ...


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


class Context:
    """One llama.cpp context: a KV cache with sequences, and batched decoding."""

    def __init__(self, model: ModelShape, handle, n_ctx: int, n_batch: int, n_threads: int,
                 unified: bool = False, min_pass: int = MIN_PASS) -> None:
        self.model = model
        #: the fewest rows a pass of a long input holds (runtime.kernel.min_pass): fewer
        #: would take other kernels than a longer pass over the same rows
        self.min_pass = min_pass
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
        #: called as tap(handle, batch, n) after every decode (an edgespec.runtime.taps.RowTap)
        self.nextn_tap: Callable[..., None] | None = None

    def _run_batch(self, b, n: int, what: str = "") -> None:
        """Evaluate the first ``n`` entries of batch ``b`` (every decode ends here)."""
        b.n_tokens = n
        rc = _ll.llama_decode(self._c, b)
        if rc != 0:
            raise EdgespecError(f"llama_decode{what} failed with status {rc}"
                                f"{' (KV cache full)' if rc == 1 else ''}: {recent_log(3)}")
        if self.nextn_tap is not None:
            self.nextn_tap(self._c, b, n)

    def decode(self, tokens: Sequence[int], pos0: int, seq_id: int = 0,
               logits: str = "last") -> np.ndarray:
        """Evaluate ``tokens`` at positions pos0.. in sequence ``seq_id``.

        Returns a float32 copy of the logits: shape (1, n_vocab) for "last",
        (len(tokens), n_vocab) for "all", (0, n_vocab) for "none". Inputs longer
        than n_batch are split (runtime.kernel.pass_sizes: never into a short last pass);
        only the final chunk can carry logits.
        """
        n = len(tokens)
        check_decode(n, pos0, self.n_ctx, self.n_batch, logits)
        nv = self.model.n_vocab
        out = None
        start = 0
        for size in pass_sizes(n, self.n_batch, self.min_pass):
            chunk = tokens[start:start + size]
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

    def _check_seq(self, seq_id: int) -> None:
        if not 0 <= int(seq_id) < self.n_seq_max:
            raise EdgespecError(f"sequence {seq_id} outside 0..{self.n_seq_max - 1}: the context "
                                f"was created with n_seq_max={self.n_seq_max}")

