"""Greedy verification against a recorded output, the one rule both replays use.

Under greedy decoding the target takes a draft token exactly when it is the token the
target chose there, so a recorded output says how many tokens of any draft a pass would
accept without running the model.
"""
from __future__ import annotations

from typing import Sequence


def matched(tokens: Sequence[int], ref: Sequence[int], at: int) -> int:
    """How many leading ``tokens`` equal ``ref[at:]``: a draft's accepted count at
    position ``at`` of the reference output (it stops where the reference ends)."""
    a = 0
    while a < len(tokens) and at + a < len(ref) and tokens[a] == ref[at + a]:
        a += 1
    return a
