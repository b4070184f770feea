"""The proposers' checks of their numeric options, one message shape for all of them.

Pure Python on purpose: a proposer written in Python (lookahead) checks its options
without loading the native library, and a user sees the same sentence whichever proposer
refused: ``suffix max_draft=0 is out of range: it must be in [1, 64]``.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` as an int when it is a whole number (not a bool) in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(f"{name}={value!r} must be an integer in [{lo}, {hi}]")
    if not lo <= int(value) <= hi:
        raise InvalidInputError(f"{name}={value} is out of range: it must be in [{lo}, {hi}]")
    return int(value)


def check_fraction(name: str, value: object) -> float:
    """``value`` as a float when it is a number (not a bool) in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not 0.0 <= float(value) <= 1.0:
        raise InvalidInputError(f"{name}={value!r} must be a number in [0, 1]")
    return float(value)


__all__ = ["check_fraction", "check_int"]
