"""Hypothesis strategies for token streams: random, and repetitive (chunks of a
small phrase book, so that long matches and branching continuations are common)."""
from __future__ import annotations

from hypothesis import strategies as st


def random_stream(max_len: int = 120, vocab: int = 6):
    return st.lists(st.integers(0, vocab - 1), max_size=max_len)


@st.composite
def repetitive_stream(draw, max_len: int = 160, vocab: int = 50):
    book = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8),
                         min_size=1, max_size=5))
    out: list[int] = []
    while len(out) < max_len:
        pick = draw(st.integers(-1, len(book) - 1))
        if pick < 0:
            if draw(st.booleans()):
                break
            out.append(draw(st.integers(0, vocab - 1)))  # a stray token breaks the pattern
        else:
            out.extend(book[pick])
    return out[:max_len]


def stream(max_len: int = 120):
    return st.one_of(random_stream(max_len), repetitive_stream(max_len))


def chunked(tokens: list[int], cuts: list[int]) -> list[list[int]]:
    """Splits tokens at the (sorted, deduplicated) cut points."""
    pts = sorted({c % (len(tokens) + 1) for c in cuts} | {0, len(tokens)})
    return [tokens[a:b] for a, b in zip(pts, pts[1:])]
