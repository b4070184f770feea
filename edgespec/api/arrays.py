"""Array types shared by the typed seams (numpy only, nothing of edgespec).

Logits and probabilities travel as float arrays whose precision depends on the source
(llama.cpp hands out float32 logits, sampling works in float64): one alias keeps the
annotations honest without pinning a dtype the code does not rely on.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

#: a row (n_vocab,) or rows (n, n_vocab) of logits or probabilities
FloatArray = NDArray[np.floating[Any]]