"""``Llama.eval`` / ``sample`` / ``generate`` / ``n_tokens`` / ``input_ids``:
llama-cpp-python's token-level API over the engine's request sequence.

``eval`` decodes tokens after what the sequence holds (the engine's prefix cache is told,
so the next request reuses them); ``sample`` chooses from the rows the last ``eval``
returned, with edgespec's sampler; ``generate`` runs :meth:`Engine.stream` on the token
prompt, so its tokens are drafted and verified like any request's (greedy output stays the
plain path's in exact mode) and a prompt the sequence already holds is not evaluated again.
Closing the generator (``islice``, ``break``) ends the request; the sequence then holds
the prompt and every token yielded but the last, as llama-cpp-python's does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ..api.events import Step
from ..api.params import GenerationParams, SamplingParams
from ..decoding import sampling
from ..errors import ContextOverflowError, InvalidInputError

if TYPE_CHECKING:
    from ..engine.engine import Engine


class Rows:
    """The logits rows of the last :func:`evaluate`, by absolute position."""

    def __init__(self) -> None:
        self.pos0 = 0
        self.rows = np.zeros((0, 0), dtype=np.float32)

    def row(self, idx: int | None) -> np.ndarray:
        n = len(self.rows)
        if n == 0:
            raise InvalidInputError("sample() needs logits: call eval() first")
        if idx is None or idx == -1:
            return self.rows[-1]
        if self.pos0 <= idx < self.pos0 + n:
            return self.rows[idx - self.pos0]
        if 0 <= idx < n:  # an index into the last batch
            return self.rows[idx]
        raise InvalidInputError(f"idx {idx}: the last eval() has logits for positions "
                                f"{self.pos0}..{self.pos0 + n - 1}")


def evaluate(engine: "Engine", tokens: Sequence[int], rows: Rows) -> None:
    """Decode ``tokens`` after what the request sequence holds."""
    toks = [int(t) for t in tokens]
    if not toks:
        return
    bad = [t for t in toks if not 0 <= t < engine.target.n_vocab]
    if bad:
        raise InvalidInputError(f"token id {bad[0]} is outside the vocabulary "
                                f"(0..{engine.target.n_vocab - 1})")
    with engine.exclusive():
        kv, ctx = engine.kv_cache, engine.ctx
        held = list(kv.held)
        if len(held) + len(toks) > ctx.n_ctx:
            raise ContextOverflowError(f"{len(held)} held + {len(toks)} tokens exceed the "
                                       f"context of {ctx.n_ctx}")
        out = []
        try:
            for i in range(0, len(toks), ctx.n_batch):
                chunk = toks[i:i + ctx.n_batch]
                out.append(ctx.decode(chunk, len(held) + i, kv.seq_id, logits="all"))
        except BaseException:
            kv.invalidate()
            raise
        kv.commit(held + toks)
        kv.conversation = True
        rows.pos0 = len(held)
        rows.rows = np.concatenate(out)


def choose(row: np.ndarray, history: Sequence[int], params: SamplingParams) -> int:
    """One token from a logits row, as a request's plain path would choose it."""
    if params.greedy:
        return sampling.greedy_token(row, history, params)
    return sampling.sample(sampling.distribution(row, history, params),
                           sampling.make_rng(params.seed))


def generate(engine: "Engine", tokens: Sequence[int], params: SamplingParams,
             logits_processor=None) -> Iterator[int]:
    """Tokens after ``tokens`` until the consumer stops (or the context is full)."""
    prompt = tuple(int(t) for t in tokens)
    room = engine.ctx.n_ctx - len(prompt)
    if room < 1:
        raise ContextOverflowError(f"the prompt is {len(prompt)} tokens but the context "
                                   f"holds {engine.ctx.n_ctx}")
    # an end-of-generation token ends it too (llama-cpp-python's caller stops there)
    events = engine.stream(prompt, GenerationParams(max_tokens=room, sampling=params,
                                                    chat=False),
                           logits_processor=logits_processor, reuse=True)
    try:
        for ev in events:
            if isinstance(ev, Step):
                yield from (int(t) for t in ev.tokens)
    finally:
        events.close()


__all__ = ["Rows", "choose", "evaluate", "generate"]
