"""Prefix reuse: a request prefills only what the KV cache does not already hold.

A chat client sends the whole conversation every turn; turn 10 would re-read every
earlier turn. :class:`PrefixCache` remembers which tokens one sequence of a context
holds, position by position, and a new prompt

    reuses  the longest common token prefix with what is held (the working sequence,
            or a sequence state kept in RAM by :class:`StateCache`, whichever is longer),
    trims   every held position past it,
    decodes only the rest, with logits at the last prompt token.

At least the last prompt token is always decoded, because its logits choose the first
new token. A request that promises its text (exact mode, and outside it a greedy or seeded
request: edgespec.loop.state.Request.prefilled_only) reuses only positions a prefill wrote:
the KV of generated tokens was written by decode and verify passes, whose kernels can
differ from a long prefill's in the last bits (Qwen2.5 1.5B Q4_K_M here: turn 2 of
Spec-Bench question 81 changed; the same prompt sent twice, reusing all but its last token,
moved the first token's logits by up to 0.52), so the previous answer is prefilled again
and the output stays the output without reuse. Even a prefilled prefix is reused only up to
a multiple of ROW_GROUP, so the kernels group every row as a prefill of the whole prompt
would, and only rows of passes of at least the context's ``min_pass`` tokens (MIN_PASS, or
64 over an F16 cache with flash attention: runtime.kernel.min_pass) count as
prefill-written (shorter passes take other kernels); the suffix computed is never shorter
either, and the context never splits a long input into a short last pass
(runtime.kernel.pass_sizes), so a cold prefill computes every row as a warm one does.
Positions stay what they were when the tokens were first evaluated, so a reused prefix
means exactly what it meant then. An unseeded sampled request promises nothing and
reuses every held position.

What is held after a request is the prompt and the generated tokens the target has
evaluated (the pending last token is not): the next turn of the conversation, whose
prompt starts with the same rendered history, reuses all of it up to the first token
where the chat template's retokenization of the answer differs from the tokens the
model generated.

:class:`StateCache` keeps several sequences' states (the last turns of several
conversations) in a byte budget with least-recently-used eviction, through llama.cpp's
per-sequence state API (``Context.state_get`` / ``state_set``).

:meth:`PrefixCache.refresh` gives those requests their reuse back: once a turn has finished
(idle time, while its answer is read), the generated tokens' positions are prefilled again, from
the last row-group boundary a prefill wrote, in passes that each start on a boundary and
hold at least ``min_pass`` tokens. The sequence then holds prefill-written KV for the whole turn
and the next turn computes only its new message. Stopped between passes, it keeps what it
refreshed.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..api.arrays import FloatArray
from ..errors import EdgespecError
# the kernels' grouping of a pass's rows (runtime.kernel says why each is what it is)
from ..runtime.kernel import MIN_PASS, ROW_GROUP, pass_sizes

if TYPE_CHECKING:
    from ..runtime.context import Context

#: a held sequence about to lose at least this many positions is saved to the RAM cache
#: first (a conversation being switched away from); a few retokenized tokens are not
SAVE_MIN_DROPPED = 32
#: a state shorter than this is cheaper to prefill than to keep
MIN_STATE_TOKENS = 16
DEFAULT_RAM_BYTES = 256 << 20
#: positions one refresh pass prefills: a multiple of ROW_GROUP, large enough for the gemm
#: kernels' throughput, small enough that a cancel waits well under a second
REFRESH_CHUNK = 64


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


@dataclass
class StateEntry:
    tokens: tuple[int, ...]  # what the state holds, position by position
    state: bytes
    prefilled: int = 0  # tokens[:prefilled] were written by prefill passes

    @property
    def nbytes(self) -> int:
        return len(self.state)


class StateCache:
    """Sequence states within a byte budget, least recently used evicted first.

    An entry whose tokens are a prefix of a newer entry's is dropped: the newer one
    serves every prompt the older one could (the earlier turn of the same conversation).
    """

    def __init__(self, budget_bytes: int = DEFAULT_RAM_BYTES) -> None:
        if budget_bytes < 0:
            raise EdgespecError(f"the KV state cache budget must be >= 0 bytes (got {budget_bytes})")
        self.budget_bytes = int(budget_bytes)
        self._entries: OrderedDict[tuple[int, ...], StateEntry] = OrderedDict()
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[StateEntry]:
        """Oldest first."""
        return list(self._entries.values())

    def put(self, tokens: Sequence[int], state: bytes, prefilled: int = 0) -> bool:
        """Keep ``state`` (which holds ``tokens``); False when it cannot fit the budget."""
        key = tuple(int(t) for t in tokens)
        if len(state) > self.budget_bytes or len(key) < MIN_STATE_TOKENS:
            return False
        for k in [k for k in self._entries if len(k) <= len(key) and key[:len(k)] == k]:
            self._drop(k)
        if any(len(k) > len(key) and k[:len(key)] == key for k in self._entries):
            return False  # a longer state of the same conversation already serves it
        self._entries[key] = StateEntry(key, state, prefilled)
        self.nbytes += len(state)
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        return True

    def best(self, prompt: Sequence[int]) -> tuple[StateEntry | None, int]:
        """The entry sharing the longest prefix with ``prompt``, and that length (touched
        as most recently used)."""
        best, n = None, 0
        for e in self._entries.values():
            m = common_prefix(e.tokens, prompt)
            if m > n:
                best, n = e, m
        if best is None:
            self.misses += 1
        else:
            self.hits += 1
            self._entries.move_to_end(best.tokens)
        return best, n

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


def _aligned(n: int) -> int:
    return n - n % ROW_GROUP


@dataclass(frozen=True)
class Prefill:
    """What a prefill reused and computed; ``logits`` is the last prompt token's row."""

    logits: FloatArray
    reused: int
    computed: int
    restored: bool  # the reused prefix came from the RAM state cache


@dataclass(frozen=True)
class PrefillStart:
    """A prefill under way (:meth:`PrefixCache.start`): positions ``reused`` onwards of
    ``prompt`` are still to be decoded."""

    prompt: list[int]
    reused: int
    restored: bool
    written: int  # of the reused prefix, what earlier prefills wrote
    reuse: bool


class PrefixCache:
    """The tokens one sequence of a context holds, and prefix reuse over them.

    ``ram`` (a :class:`StateCache`) is optional; a context without the state API (the
    fake backend) works without it. Whoever decodes into the sequence reports what it
    holds afterwards with :meth:`commit`; after an error, :meth:`invalidate`.
    """

    def __init__(self, ctx: Context, seq_id: int = 0, ram: StateCache | None = None) -> None:
        self.ctx, self.seq_id = ctx, seq_id
        self.ram = ram if hasattr(ctx, "state_get") else None
        self.held: list[int] = []
        self.prefilled = 0  # held[:prefilled] were written by prefill passes
        #: the shortest pass whose rows count as prefill-written: the context's own, which
        #: also shapes how it splits a long input (``_marked`` predicts that split)
        self.min_pass = int(getattr(ctx, "min_pass", MIN_PASS))
        # what is held belongs to a conversation someone may come back to (its request
        # reused, or a session was loaded): only then is it worth a copy in RAM when a
        # request that does not reuse takes the sequence over
        self.conversation = False

    def prefill(self, prompt: Sequence[int], reuse: bool = True,
                prefilled_only: bool = False) -> Prefill:
        """``prefilled_only``: reuse only what earlier prefills wrote (the module docstring
        says why)."""
        start = self.start(prompt, reuse, prefilled_only)
        try:
            logits = self.ctx.decode(start.prompt[start.reused:], start.reused, self.seq_id,
                                     logits="last")
        except BaseException:
            self.invalidate()
            raise
        return self.finish(start, logits)

    def start(self, prompt: Sequence[int], reuse: bool = True,
              prefilled_only: bool = False) -> "PrefillStart":
        """The first half of a prefill: pick the prefix to reuse (restoring it from RAM when
        a saved state holds more), trim the rest. The caller decodes ``prompt[reused:]`` from
        position ``reused`` (in one pass, or in chunks shared with other sequences), then
        calls :meth:`finish`; on an error, :meth:`invalidate`."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise EdgespecError("prefill called with an empty prompt")
        n, restored = 0, False
        if reuse:
            n = min(common_prefix(self.held, prompt), len(prompt) - 1)
            if prefilled_only:
                n = _aligned(max(0, min(n, self.prefilled, len(prompt) - self.min_pass)))
            if self.ram is not None:
                if self.conversation and len(self.held) - n >= SAVE_MIN_DROPPED:
                    self.save()
                entry, m = self.ram.best(prompt)
                m = min(m, len(prompt) - 1)
                if prefilled_only and entry is not None:
                    m = _aligned(max(0, min(m, entry.prefilled, len(prompt) - self.min_pass)))
                if entry is not None and m > n:
                    n, restored = self._restore(self.ram, entry, m), True
        elif self.ram is not None and self.conversation and len(self.held) >= SAVE_MIN_DROPPED:
            self.save()  # a request that does not reuse still leaves a conversation findable
        try:
            if n == 0:
                # this sequence only: others of the context may be serving other requests
                self.ctx.trim(self.seq_id, 0)
            elif n < len(self.held):
                self.ctx.trim(self.seq_id, n)
            self.held = prompt[:n]
            written = min(self.prefilled, n)  # what of the reused prefix a prefill wrote
            self.prefilled = written
        except BaseException:
            self.invalidate()
            raise
        return PrefillStart(prompt, n, restored, written, reuse)

    def finish(self, start: "PrefillStart", logits: FloatArray, whole: bool = True) -> Prefill:
        """The sequence now holds the whole prompt. ``whole``: the rest was decoded by this
        sequence's own passes of n_batch rows, as a prefill from position 0 would group
        them; chunks shared with other sequences (continuous batching) are not, and count
        as decode-written (``prefilled_only`` reuse skips them)."""
        prompt, n, written = start.prompt, start.reused, start.written
        self.held = prompt
        self.conversation = start.reuse
        # this pass extends the prefill-written extent when it continues it on a row-group
        # boundary (the rows are then grouped as in a prefill from position 0)
        self.prefilled = (self._marked(n, len(prompt))
                          if whole and written == n and n % ROW_GROUP == 0
                          else _aligned(written))
        return Prefill(logits=logits, reused=n, computed=len(prompt) - n, restored=start.restored)

    def commit(self, tokens: Sequence[int]) -> None:
        """The sequence holds exactly ``tokens`` now (positions 0..len-1)."""
        self.held = [int(t) for t in tokens]
        self.prefilled = min(self.prefilled, len(self.held))

    def refresh(self, stop: Callable[[], bool] = lambda: False,
                chunk: int | None = None) -> int:
        """Prefill the held positions no prefill wrote (the last answer's), so a
        ``prefilled_only`` prefill reuses them; returns how many positions are now
        prefill-written that were not.

        The pass starts at the last ROW_GROUP boundary a prefill wrote and goes in chunks of
        ``chunk`` positions (a multiple of ROW_GROUP), so every row is grouped as a prefill
        of the whole prompt from position 0 groups it. ``stop`` is asked before each chunk:
        when it says so, the sequence keeps what was refreshed and drops the rest (the next
        turn prefills it). The held tokens past the last boundary are prefilled too (the
        sequence must stay contiguous) but stay unmarked: a row group they would share with
        the next turn's tokens is not complete yet.
        """
        chunk = REFRESH_CHUNK if chunk is None else chunk
        if chunk <= 0 or chunk % ROW_GROUP:
            raise EdgespecError(f"a refresh chunk is a positive multiple of {ROW_GROUP} "
                                f"positions (got {chunk})")
        tokens = list(self.held)
        end = _aligned(len(tokens))
        if end <= self.prefilled:
            return 0
        before = self.prefilled
        # a pass shorter than min_pass marks nothing: start early enough for one that long
        least = self.min_pass
        start = max(0, min(_aligned(self.prefilled), _aligned(len(tokens) - least)))
        chunk = max(least, min(chunk, _aligned(self.ctx.n_batch) - least))
        pos = start
        try:
            self.ctx.trim(self.seq_id, start)
            self.held, self.prefilled = tokens[:start], min(self.prefilled, start)
            while pos < len(tokens) and not stop():
                n = min(chunk, len(tokens) - pos)
                if len(tokens) - pos - n < least:  # no short pass at the end
                    n = len(tokens) - pos
                self.ctx.decode(tokens[pos:pos + n], pos, self.seq_id, logits="none")
                self.held = tokens[:pos + n]
                if self.prefilled == pos:
                    self.prefilled = self._marked(pos, pos + n)
                pos += n
        except BaseException:
            self.invalidate()
            raise
        return max(0, self.prefilled - before)

    def _marked(self, pos0: int, end: int) -> int:
        """The prefill-written extent after a prefill of positions pos0..end-1 that continues
        one ending at pos0 (a row-group boundary): its whole row groups, except those of a
        pass shorter than min_pass (only an input shorter than that: the context splits a
        long one by runtime.kernel.pass_sizes)."""
        n = end - pos0
        n_batch = getattr(self.ctx, "n_batch", n) or n
        sizes = pass_sizes(n, n_batch, self.min_pass)
        if sizes and sizes[-1] < self.min_pass:
            end -= sizes[-1]
        return max(pos0, _aligned(end))

    def invalidate(self) -> None:
        """Forget what the sequence holds (after an error left it unknown)."""
        self.held = []
        self.prefilled = 0
        self.conversation = False
        try:
            self.ctx.trim(self.seq_id, 0)  # this sequence only: others may be serving
        except Exception:  # pragma: no cover - a closed context holds nothing anyway
            pass

    def save(self) -> bool:
        """Copy the held sequence into the RAM cache (False when there is none or it does
        not fit)."""
        if self.ram is None or len(self.held) < MIN_STATE_TOKENS:
            return False
        return self.ram.put(self.held, self.ctx.state_get(self.seq_id), self.prefilled)

    def adopt(self, tokens: Sequence[int], state: bytes, prefilled: int = 0) -> bool:
        """Make the working sequence hold a saved ``state`` of ``tokens`` (a session from
        disk, already checked against this model and configuration). False, with the
        sequence empty, when llama.cpp refuses it or it does not hold what it claims."""
        if not hasattr(self.ctx, "state_set") or not 0 < len(tokens) < self.ctx.n_ctx:
            return False
        if self.conversation and len(self.held) >= SAVE_MIN_DROPPED:
            self.save()
        try:
            self.ctx.state_set(state, self.seq_id)
            pos_max = getattr(self.ctx, "seq_pos_max", None)
            if pos_max is not None and pos_max(self.seq_id) != len(tokens) - 1:
                raise EdgespecError("the restored state does not hold the saved tokens")
        except EdgespecError:
            self.invalidate()
            return False
        self.held = [int(t) for t in tokens]
        self.prefilled = min(int(prefilled), len(self.held))
        self.conversation = True
        return True

    def _restore(self, ram: StateCache, entry: StateEntry, m: int) -> int:
        try:
            self.ctx.state_set(entry.state, self.seq_id)
        except EdgespecError:
            self.held, self.prefilled = [], 0
            ram._drop(entry.tokens)
            return 0
        self.held, self.prefilled = list(entry.tokens), entry.prefilled
        return m
