"""A fake head and fake target rows for the proposers fed by the target's verify pass
(``mtp``, ``eagle3``, :mod:`edgespec.proposers.head_base`): the head records what its cache
holds at each position, so a test can check it stays in step with the accepted sequence.

    head, tap = FakeHead(), FakeTap(N_EMBD)      # mtp: rows as wide as the head
    head, tap = FakeHead(), FakeTap(N_FEAT)      # eagle3: three layers' features
"""
from __future__ import annotations

import numpy as np

N_EMBD, N_FEAT, N_VOCAB = 4, 12, 16


class FakeHead:
    """A head context: its cache maps a position to (token, the input row's tag, its first
    value); it drafts "the next id"; ``encode`` (EAGLE-3's) tags g with the feature row's
    first value."""

    def __init__(self) -> None:
        self.n_ctx, self.n_embd, self.n_feat = 256, N_EMBD, N_FEAT
        self.kv: dict[int, tuple[int, float]] = {}
        self.closed = False

    def encode(self, features):
        return np.repeat(features[:, :1], N_EMBD, axis=1).astype(np.float32)

    def decode(self, tokens, pos0, rows, want=True):
        for i, tok in enumerate(tokens):
            assert pos0 + i not in self.kv, f"position {pos0 + i} decoded twice"
            self.kv[pos0 + i] = (int(tok), float(rows[i][0]))
        assert sorted(self.kv) == list(range(len(self.kv))), "a hole in the cache"
        logits = np.zeros(N_VOCAB, np.float32)
        logits[(tokens[-1] + 1) % N_VOCAB] = 5.0  # drafts "the next id"
        return (logits, np.full(N_EMBD, -1.0, np.float32)) if want else None

    def trim(self, from_pos):
        self.kv = {p: v for p, v in self.kv.items() if p < from_pos}

    def clear(self):
        self.kv = {}

    def close(self):
        self.closed = True


class FakeTap:
    """The target's rows, ``width`` wide: row p is tagged p, as the verify pass gives;
    ``missing`` positions the target never produced."""

    def __init__(self, width: int, missing=()) -> None:
        self.width = width
        self.missing = set(missing)
        self.detached = False
        self.forgotten = -1

    def row(self, seq, pos):
        assert seq == 0 and pos >= self.forgotten
        return None if pos in self.missing else np.full(self.width, float(pos), np.float32)

    def forget_below(self, seq, pos):
        self.forgotten = max(self.forgotten, pos)

    def detach(self):
        self.detached = True


def in_step(head: FakeHead, session) -> None:
    """The head's cache holds positions 0..kv_len-1, position P the token ``seq[P + lead]``
    with the target's row of position ``P + lead - 1`` (zeros before the start): what
    :mod:`edgespec.proposers.head_base` promises after every step."""
    lead = session.lead
    assert sorted(head.kv) == list(range(session.kv_len))
    for p, (tok, tag) in head.kv.items():
        assert tok == session.seq[p + lead] and tag == float(max(p + lead - 1, 0))
