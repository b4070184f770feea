"""llama-cpp-python's high-level ``Llama`` as the benchmark's anchors run it: with
``LlamaPromptLookupDecoding`` (traced for edgespec.lab.bench.anchors.trace) and with ``LlamaRAMCache``
(for tools/bench_turn2.py). edgespec.runtime.backend loads them; the bench logic is here."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Sequence

from ....errors import ContextOverflowError, EdgespecError, ModelError
from ....runtime import backend
from ....runtime.backend import default_threads


# --- llama-cpp-python's own speculation ------------------------------------------------------
@dataclass(frozen=True)
class AnchorTrace:
    """What one anchor generation observed (edgespec.lab.bench.anchors.trace turns it into RequestStats)."""

    prompt_tokens: int
    tokens: tuple[int, ...]  # emitted tokens, end-of-generation token excluded
    token_times: tuple[float, ...]  # seconds since start at which each yielded token came out
    passes: tuple[tuple[int, int], ...]  # per decode pass: (sequence length before it, drafted)
    first_token_seconds: float  # prompt evaluation + first sample
    total_seconds: float
    stop_reason: str  # "eos" | "length"
    eog_time: float | None = None  # when the end-of-generation token came out, if it did


class PromptLookupAnchor:
    """llama-cpp-python's high-level ``Llama`` with ``LlamaPromptLookupDecoding``, as users run it
    today, traced for the benchmark (see edgespec.lab.bench.anchors.trace for how the trace is read)."""

    def __init__(self, llm, lookup, passes: list, num_pred_tokens: int | None = None,
                 owner: bool = True, shared_weights: bool = False) -> None:
        self._llm = llm
        self.shared_weights = shared_weights  # computes with the engine's loaded model
        self._lookup = lookup
        self._passes = passes  # the lookup appends (sequence length, drafted) on every call
        self._is_eog = backend.eog_test(llm)
        self._owner = owner  # closes the model (the anchors sharing it do not)
        self.n_ctx = llm.n_ctx()
        self.num_pred_tokens = (lookup.num_pred_tokens if num_pred_tokens is None
                                else num_pred_tokens)

    def drafting(self, num_pred_tokens: int) -> "PromptLookupAnchor":
        """The same loaded model drafting ``num_pred_tokens`` a pass: every llama-pld:N of
        a run shares one model and its logits buffer (n_ctx x n_vocab floats, which every
        prompt row is written to), instead of each holding its own (1.7 GiB at load and
        ~1 GiB of logits per instance for Qwen 1.5B at 4k context)."""
        return PromptLookupAnchor(self._llm, self._lookup, self._passes, num_pred_tokens,
                                  owner=False, shared_weights=self.shared_weights)

    def generate(self, prompt_tokens: Sequence[int], max_tokens: int, temperature: float = 0.0):
        if len(prompt_tokens) + max_tokens + 1 > self.n_ctx:
            raise ContextOverflowError(
                f"the anchor's context holds {self.n_ctx} tokens, the request needs "
                f"{len(prompt_tokens) + max_tokens + 1}")
        self._passes.clear()
        self._lookup.num_pred_tokens = self.num_pred_tokens  # the model may be shared
        self._llm.reset()  # no prefix reuse between requests: every request prefills, as ours do
        tokens: list[int] = []
        times: list[float] = []
        eog_time = None
        first = None
        t0 = time.perf_counter()
        gen = self._llm.generate(list(prompt_tokens), temp=temperature, top_k=0, top_p=1.0,
                                 min_p=0.0, repeat_penalty=1.0, reset=True)
        try:
            for tok in gen:
                now = time.perf_counter() - t0
                first = now if first is None else first
                if self._is_eog(tok):
                    eog_time = now
                    break
                tokens.append(int(tok))
                times.append(now)
                if len(tokens) >= max_tokens:
                    break
        except (ValueError, RuntimeError) as e:
            # one failed anchor request is a recorded error, not the end of a benchmark
            raise EdgespecError(f"llama-cpp-python's prompt lookup failed: {e}") from None
        finally:
            gen.close()
        total = time.perf_counter() - t0
        return AnchorTrace(prompt_tokens=len(prompt_tokens), tokens=tuple(tokens),
                           token_times=tuple(times), passes=tuple(self._passes),
                           first_token_seconds=first if first is not None else total,
                           total_seconds=total, stop_reason="eos" if eog_time is not None else "length",
                           eog_time=eog_time)

    def close(self) -> None:
        if self._owner:
            self._llm.close()


def shares_weights(model) -> bool:
    """Whether the anchor may compute with ``model`` (an engine's loaded target) instead of
    loading the file again: only a load llama-cpp-python's defaults would make too (all on
    the CPU, repacked, no NextN layers, no RPC split), so its speed stays its own."""
    return (getattr(model, "n_gpu_layers", 1) == 0 and bool(getattr(model, "use_extra_bufts", False))
            and not getattr(model, "load_mtp", True) and not getattr(model, "placement", ""))


def anchor_prompt_lookup(model_path: str | os.PathLike, n_ctx: int, threads: int | None,
                         num_pred_tokens: int = 10, max_ngram_size: int = 2,
                         loaded=None) -> PromptLookupAnchor:
    """Load the anchor, on ``loaded`` (the engine's target) where :func:`shares_weights`
    allows, else on its own copy of the file. It writes logits for every position it
    evaluates; :func:`fold_scores` keeps those rows from staying resident."""
    if loaded is not None and not shares_weights(loaded):
        loaded = None
    LlamaPromptLookupDecoding = backend.prompt_lookup_decoding()

    passes: list[tuple[int, int]] = []

    class _Traced(LlamaPromptLookupDecoding):
        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            passes.append((int(input_ids.shape[0]), int(draft.shape[0])))
            return draft

    threads = threads or default_threads()
    lookup = _Traced(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
    try:
        # logits_all=True by hand: with only draft_model set, Llama sizes its logits buffer
        # for n_batch rows but writes every prompt row, and fails on prompts over n_batch.
        # use_mmap=False for its own copy: the bench holds it beside the engine's, and a
        # mapped load that repacks keeps the file's pages resident beside the repacked copy
        # (+0.6 GiB for Qwen 1.5B); where the weights live changes memory, not arithmetic
        llm = backend.high_level_llama(model_path, n_ctx, threads, loaded=loaded,
                                       draft_model=lookup, logits_all=True, use_mmap=False)
    except (ValueError, RuntimeError) as e:
        raise ModelError(f"llama-cpp-python could not load {model_path} for the prompt-lookup "
                         f"anchor: {e}") from None
    fold_scores(llm)
    return PromptLookupAnchor(llm, lookup, passes, shared_weights=loaded is not None)


def fold_scores(llm) -> None:
    """Let every row of ``llm.scores`` share one row of memory.

    With logits_all, llama-cpp-python copies every evaluated row's logits into ``scores``
    (n_ctx x n_vocab floats: 0.6 MiB a token for Qwen's vocabulary, so a 2k-token prompt
    pins 1.2 GiB) and reads them back only for logprobs, logits processors and stopping
    criteria, none of which the anchor uses: it samples from llama.cpp's own logits. A
    zero-stride view keeps the copy (the same work per row) but not the rows."""
    import numpy as np  # deferred: bench-only

    shape = llm.scores.shape
    row = np.zeros((1, shape[1]), dtype=np.single)
    llm.scores = np.lib.stride_tricks.as_strided(row, shape=shape, strides=(0, row.strides[1]))


# --- llama-cpp-python's prompt cache across conversation turns -------------------------------
class RamCacheAnchor:
    """llama-cpp-python's high-level ``Llama`` with ``LlamaRAMCache``, the prompt cache its users
    reuse a conversation's KV with, for tools/bench_turn2.py. ``complete`` streams a
    completion of a token prompt and returns (text, seconds to the first token, seconds in
    all); ``reset`` forgets the context's own tokens, so the next prompt's prefix can come
    only from the RAM cache."""

    def __init__(self, llm, cache) -> None:
        self._llm, self.cache = llm, cache

    def complete(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[str, float, float]:
        t0 = time.perf_counter()
        first, pieces = None, []
        try:
            for chunk in self._llm.create_completion(prompt=list(prompt_tokens),
                                                     max_tokens=max_tokens, temperature=0.0,
                                                     top_k=1, repeat_penalty=1.0, stream=True):
                first = time.perf_counter() - t0 if first is None else first
                pieces.append(chunk["choices"][0]["text"])
        except (ValueError, RuntimeError) as e:
            raise EdgespecError(f"llama-cpp-python's completion failed: {e}") from None
        total = time.perf_counter() - t0
        return "".join(pieces), first if first is not None else total, total

    def reset(self) -> None:
        self._llm.reset()

    def close(self) -> None:
        self._llm.close()


def anchor_ram_cache_llama(model_path: str | os.PathLike, n_ctx: int, threads: int | None,
                           capacity_bytes: int = 2 << 30) -> RamCacheAnchor:
    """Load the RAM-cache anchor (its own context of ``n_ctx`` tokens, beside the engine's)."""
    backend.ensure_init()
    threads = threads or default_threads()
    try:
        llm = backend.high_level_llama(model_path, n_ctx, threads)
    except (ValueError, RuntimeError) as e:
        raise ModelError(f"llama-cpp-python could not load {model_path} for the RAM-cache "
                         f"anchor: {e}") from None
    cache = backend.ram_cache(capacity_bytes)
    llm.set_cache(cache)
    return RamCacheAnchor(llm, cache)
