"""``Llama.save_state`` / ``load_state`` / ``reset`` and the prompt cache of ``set_cache``,
over the engine's generation context.

A :class:`LlamaState` carries the attributes ``llama_cpp.LlamaState`` has (``input_ids``,
``n_tokens``, ``llama_state``, ``llama_state_size``, ``seed``; ``scores`` is empty: edgespec
keeps no logits matrix), so llama-cpp-python's own caches (``LlamaRAMCache``,
``LlamaDiskCache``), which index states by ``input_ids`` and size them by
``llama_state_size``, hold edgespec's states unchanged. The state is the KV of the
engine's request sequence (llama.cpp's sequence format) plus the tokens it holds and how
many of them a prefill wrote, so a restored state is reused exactly as the engine's own
prefix cache would reuse it (exact mode stays exact).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidInputError

if TYPE_CHECKING:
    from ..engine.engine import Engine


@dataclass
class LlamaState:
    """What :func:`save` copied: ``llama_cpp.LlamaState``'s attributes, plus ``prefilled``."""

    input_ids: np.ndarray  # the tokens the sequence holds (np.intc)
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int | None  # the Llama's seed chain (None: fresh entropy per request)
    prefilled: int = 0  # input_ids[:prefilled] were written by prefill passes
    scores: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.single))


def save(engine: "Engine", seed: int | None) -> LlamaState:
    """The engine's request sequence as it is now (between requests)."""
    with engine.exclusive():
        kv = engine.kv_cache
        held = list(kv.held)
        data = engine.ctx.state_get(kv.seq_id) if held else b""
        return LlamaState(np.array(held, dtype=np.intc), len(held), data, len(data), seed,
                          kv.prefilled)


def load(engine: "Engine", state: LlamaState) -> None:
    """Put a saved sequence back: the next request whose prompt starts with its tokens
    prefills only the rest. A state of another model or configuration is refused by
    llama.cpp (the sequence is then left empty)."""
    ids = getattr(state, "input_ids", None)
    data = getattr(state, "llama_state", None)
    if ids is None or not isinstance(data, (bytes, bytearray)):
        raise InvalidInputError(f"load_state takes what save_state returned (got "
                                f"{type(state).__name__})")
    tokens = [int(t) for t in np.asarray(ids)[:int(getattr(state, "n_tokens", len(ids)))]]
    with engine.exclusive():
        kv = engine.kv_cache
        kv.invalidate()
        if not tokens:
            return
        try:
            engine.ctx.state_set(bytes(data), kv.seq_id)
        except BaseException:
            kv.invalidate()
            raise
        kv.commit(tokens)
        kv.prefilled = min(int(getattr(state, "prefilled", 0)), len(tokens))
        kv.conversation = True


def reset(engine: "Engine") -> None:
    """Forget what the request sequence holds, and the sequence states kept in RAM (else a
    kept earlier turn would serve the next prompt): the next prompt is prefilled whole."""
    with engine.exclusive():
        engine.kv_cache.invalidate()
        if engine.kv_cache.ram is not None:
            engine.kv_cache.ram.clear()


def held(engine: "Engine") -> list[int]:
    """The tokens the request sequence holds now."""
    return list(engine.kv_cache.held)


__all__ = ["LlamaState", "held", "load", "reset", "save"]
