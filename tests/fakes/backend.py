"""A hermetic stand-in for :mod:`edgespec.runtime.backend`: a tiny deterministic language model.

:class:`FakeModel` and :class:`FakeContext` implement what the engine uses of
``runtime.model.Model`` and ``runtime.context.Context``. The "language model" is a table: the
logits for the next token depend on the last two tokens in the KV cache only,

    row(p2, p1) = noise(p2, p1) in [-1, 1)  +  PEAK at NEXT[(p2, p1)] (or NEXT[p1])

so its greedy continuation is known in advance (:meth:`FakeModel.greedy`) and a
sampled one is reproducible. Greedy from ``"a"`` cycles ``abcéd abcéd ...`` for
ever (``é`` is two tokens, one UTF-8 byte each); from ``"x"`` it writes ``yz.``
and ends with an end-of-generation token.

The context keeps the tokens of every KV position and is strict where llama.cpp
is forgiving: a decode must start exactly at the first position not yet cached
(so a double-decoded token, a wrong trim or a skipped position fails), a trim may
not start past the cached positions, and the logits of each row are computed from
what the cache really holds. Violations raise :class:`KVMismatch`, an
``AssertionError``, so the engine never mistakes them for a user error. Every call
is recorded in ``calls`` for tests to read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from edgespec.runtime.context import check_decode, check_multi
from edgespec.runtime.kernel import KV_GGML_TYPE, MIN_PASS, min_pass
from edgespec.errors import EdgespecError

BOS, EOS, EOT = 0, 1, 2
#: id -> bytes of the token's text; the control tokens render empty unless special=True
PIECES: tuple[bytes, ...] = (
    b"", b"", b"",  # <s>, </s>, <|eot|>
    b"a", b"b", b"c", b"d", b" ", b".", b"\n",
    b"\xc3", b"\xa9",  # "é" split over two tokens
    b"x", b"y", b"z", b"ab", b"#", b"!",
)
SPECIAL = {BOS: b"<s>", EOS: b"</s>", EOT: b"<|eot|>"}
VOCAB = {p: i for i, p in enumerate(PIECES) if p}
N_VOCAB = len(PIECES)
EOG = frozenset({EOS, EOT})

A, B, C, D, SPACE, DOT, NL, E1, E2, X, Y, Z, AB, HASH, BANG = range(3, N_VOCAB)

#: greedy next token after the last one
NEXT_AFTER: dict[int, int] = {
    BOS: A, A: B, B: C, C: E1, E1: E2, E2: D, D: SPACE, SPACE: A, NL: A, AB: C,
    X: Y, Y: Z, Z: DOT, DOT: EOS, HASH: BANG, BANG: HASH, EOS: A, EOT: A,
}
#: ... unless the last two say otherwise (so a stale KV position changes the output)
NEXT_AFTER_TWO: dict[tuple[int, int], int] = {
    (DOT, SPACE): HASH,  # ". " starts a "#!#!" run instead of "abc"
    (HASH, HASH): NL,
}
PEAK = 3.0  # greedy is certain (noise < 1); sampling at temperature 1 still varies

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}\n{% endif %}")


class KVMismatch(AssertionError):
    """The engine's KV accounting disagrees with what the cache holds."""


@dataclass(frozen=True)
class Decode:
    tokens: tuple[int, ...]
    pos0: int
    seq_id: int
    logits: str


@dataclass(frozen=True)
class Trim:
    seq_id: int
    from_pos: int
    dropped: tuple[int, ...]  # the tokens the trim removed


class FakeModel:
    """The subset of ``runtime.model.Model`` the engine, the proposers and the chat path read."""

    def __init__(self, *, name: str = "fake.gguf", chat_template: str | None = CHAT_TEMPLATE,
                 n_ctx_train: int = 4096, seed: int = 1234) -> None:
        self.path = Path("/fake") / name
        self.n_vocab = N_VOCAB
        self.n_ctx_train = n_ctx_train
        self.n_layer, self.n_embd = 2, 8
        self.size_bytes = 1 << 20
        self.n_gpu_layers = 0
        self.use_extra_bufts = True
        self.bos, self.eos = BOS, EOS
        self.add_bos = True
        self.description = "fake 18-token table model"
        self._template = chat_template
        rng = np.random.default_rng(seed)
        # rows indexed [p2 + 1, p1]: p2 = -1 when only one token precedes
        self._noise = rng.uniform(-1.0, 1.0, size=(N_VOCAB + 1, N_VOCAB, N_VOCAB)).astype(np.float32)
        self.contexts: list[FakeContext] = []
        self.closed = False

    # --- the language model --------------------------------------------------------
    @staticmethod
    def next_greedy(history: Sequence[int]) -> int:
        p1 = history[-1]
        p2 = history[-2] if len(history) > 1 else None
        return NEXT_AFTER_TWO.get((p2, p1), NEXT_AFTER.get(p1, A))

    def row(self, history: Sequence[int]) -> np.ndarray:
        """Logits for the token after ``history`` (which must be non-empty)."""
        p1 = int(history[-1])
        p2 = int(history[-2]) if len(history) > 1 else -1
        out = self._noise[p2 + 1, p1].copy()
        out[self.next_greedy(history)] += PEAK
        return out

    def greedy(self, history: Sequence[int], n: int) -> list[int]:
        """The next ``n`` greedy tokens after ``history`` (EOG tokens included)."""
        h = list(history)
        for _ in range(n):
            h.append(self.next_greedy(h))
        return h[len(history):]

    # --- vocabulary ------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        out = [BOS] if add_special and self.add_bos else []
        i = 0
        while i < len(data):
            if parse_special:
                hit = next((t for t, s in SPECIAL.items() if data.startswith(s, i)), None)
                if hit is not None:
                    out.append(hit)
                    i += len(SPECIAL[hit])
                    continue
            for n in (2, 1):  # longest piece first ("ab" before "a")
                tok = VOCAB.get(data[i:i + n])
                if tok is not None:
                    out.append(tok)
                    i += n
                    break
            else:
                raise ValueError(f"the fake vocabulary has no piece for byte {data[i:i + 1]!r} "
                                 f"in {text!r}")
        return out

    def token_piece(self, token: int, special: bool = False) -> bytes:
        if not 0 <= token < N_VOCAB:
            raise EdgespecError(f"token id {token} outside the vocabulary (0..{N_VOCAB - 1})")
        return SPECIAL[token] if special and token in SPECIAL else PIECES[token]

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        return b"".join(self.token_piece(t, special) for t in tokens)

    def token_text(self, token: int) -> str:
        return self.token_piece(token, special=True).decode("utf-8", "replace")

    def token_attr(self, token: int) -> int:
        return 8 if token in SPECIAL else 2  # llama.cpp's CONTROL / NORMAL attribute bits

    def is_eog(self, token: int) -> bool:
        return token in EOG

    @property
    def eog_tokens(self) -> list[int]:
        return sorted(EOG)

    def chat_template(self) -> str | None:
        return self._template

    def meta(self, key: str) -> str | None:
        return None

    # --- contexts --------------------------------------------------------------------
    def new_context(self, n_ctx: int, n_batch: int = 512, n_threads: int | None = None,
                    n_seq_max: int = 1, flash_attn: int = 1, type_k: int | None = None,
                    type_v: int | None = None, kv_unified: bool | None = None,
                    full_seqs: int | None = None) -> "FakeContext":
        if n_ctx <= 0:
            raise EdgespecError(f"context size must be positive (got {n_ctx})")
        ctx = FakeContext(self, n_ctx=n_ctx, n_batch=max(1, min(n_batch, n_ctx)),
                          n_threads=n_threads or 1, n_seq_max=n_seq_max,
                          min_pass=min_pass(KV_GGML_TYPE["q8_0"] if type_k is None else type_k,
                                            flash_attn != 0))
        self.contexts.append(ctx)
        return ctx

    def close(self) -> None:
        self.closed = True


class FakeContext:
    """A KV cache that knows its tokens; see the module docstring for what it refuses."""

    def __init__(self, model: FakeModel, n_ctx: int, n_batch: int, n_threads: int,
                 n_seq_max: int = 1, min_pass: int = MIN_PASS) -> None:
        self.model = model
        self.n_ctx, self.n_batch, self.n_threads = n_ctx, n_batch, n_threads
        self.min_pass = min_pass
        self.n_seq_max = n_seq_max
        self.kv: dict[int, list[int]] = {}
        self.calls: list[Decode | Trim | str] = []
        #: called as on_decode(ctx, tokens, pos0) before each decode: tests block or count here
        self.on_decode: Callable[["FakeContext", list[int], int], None] | None = None
        self.closed = False

    def decode(self, tokens: Sequence[int], pos0: int, seq_id: int = 0,
               logits: str = "last") -> np.ndarray:
        if self.closed:
            raise KVMismatch("decode on a closed context")
        toks = [int(t) for t in tokens]
        n = len(toks)
        check_decode(n, pos0, self.n_ctx, self.n_batch, logits)
        if not 0 <= seq_id < self.n_seq_max:
            raise KVMismatch(f"sequence {seq_id} outside 0..{self.n_seq_max - 1}")
        bad = [t for t in toks if not 0 <= t < N_VOCAB]
        if bad:
            raise KVMismatch(f"token ids {bad} outside the vocabulary")
        cache = self.kv.setdefault(seq_id, [])
        if pos0 != len(cache):
            raise KVMismatch(f"decode of {toks} at position {pos0}, but sequence {seq_id} holds "
                             f"positions 0..{len(cache) - 1}: a position would be "
                             f"{'skipped' if pos0 > len(cache) else 'decoded twice'}")
        if self.on_decode is not None:
            self.on_decode(self, toks, pos0)
        self.calls.append(Decode(tuple(toks), pos0, seq_id, logits))
        cache.extend(toks)
        if logits == "none":
            return np.zeros((0, N_VOCAB), dtype=np.float32)
        at = range(n) if logits == "all" else [n - 1]
        return np.stack([self.model.row(cache[:pos0 + i + 1]) for i in at])

    def decode_multi(self, segments) -> list[np.ndarray]:
        if self.closed:
            raise KVMismatch("decode on a closed context")
        check_multi(segments, self.n_ctx, self.n_batch)
        self.calls.append("multi")
        return [self.decode(t, p, s, lg) for t, p, s, lg in segments]

    def trim(self, seq_id: int, from_pos: int) -> None:
        cache = self.kv.setdefault(seq_id, [])
        if not 0 <= from_pos <= len(cache):
            raise KVMismatch(f"trim of sequence {seq_id} from position {from_pos}, but it holds "
                             f"only {len(cache)} positions")
        self.calls.append(Trim(seq_id, from_pos, tuple(cache[from_pos:])))
        del cache[from_pos:]

    def clear(self) -> None:
        self.calls.append("clear")
        self.kv.clear()

    def close(self) -> None:
        self.closed = True

    # --- for tests ---------------------------------------------------------------------
    def tokens(self, seq_id: int = 0) -> list[int]:
        """What the KV cache holds for a sequence, position by position."""
        return list(self.kv.get(seq_id, []))

    @property
    def decodes(self) -> list[Decode]:
        return [c for c in self.calls if isinstance(c, Decode)]

    @property
    def trims(self) -> list[Trim]:
        return [c for c in self.calls if isinstance(c, Trim)]

    # --- draft trees ---------------------------------------------------------------------
    def decode_tree(self, tokens, positions, seq_ids_per_token, logits_mask) -> np.ndarray:
        """Each token is appended to each of its sequences, strictly at the next position;
        sequences sharing a token must agree on everything before it (as llama.cpp
        requires), and a row's logits come from its sequences' tokens."""
        if self.closed:
            raise KVMismatch("decode on a closed context")
        from edgespec.runtime.context import check_tree
        check_tree(tokens, positions, seq_ids_per_token, logits_mask, self.n_ctx, self.n_batch,
                   self.n_seq_max)
        bad = [int(t) for t in tokens if not 0 <= int(t) < N_VOCAB]
        if bad:
            raise KVMismatch(f"token ids {bad} outside the vocabulary")
        self.calls.append("tree")
        rows = []
        for t, pos, seqs, want in zip(tokens, positions, seq_ids_per_token, logits_mask):
            caches = [self.kv.setdefault(int(s), []) for s in seqs]
            for s, cache in zip(seqs, caches):
                if pos != len(cache):
                    raise KVMismatch(f"tree token {t} at position {pos}, but sequence {s} holds "
                                     f"positions 0..{len(cache) - 1}")
            if any(c != caches[0] for c in caches[1:]):
                raise KVMismatch(f"sequences {tuple(seqs)} share tree token {t} but diverged "
                                 "before it (seq_cp the prefix first)")
            for cache in caches:
                cache.append(int(t))
            if want:
                rows.append(self.model.row(caches[0]))
        if not rows:
            return np.zeros((0, N_VOCAB), dtype=np.float32)
        return np.stack(rows)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        for s in (src, dst):
            if not 0 <= s < self.n_seq_max:
                raise EdgespecError(f"sequence {s} outside 0..{self.n_seq_max - 1}: the context "
                                    f"was created with n_seq_max={self.n_seq_max}")
        if self.n_seq_max < 2:
            raise EdgespecError("seq_cp needs a context with n_seq_max > 1")
        source = self.kv.setdefault(src, [])
        cache = self.kv.setdefault(dst, [])
        end = len(source) if p1 < 0 else p1
        if len(cache) != p0 or end > len(source):
            raise KVMismatch(f"seq_cp {src}->{dst} of positions {p0}..{end - 1}: sequence {dst} "
                             f"holds {len(cache)} positions, {src} holds {len(source)}")
        self.calls.append(f"seq_cp {src}->{dst} {p0}:{end}")
        cache.extend(source[p0:end])
