"""Measuring a cost curve and probing exactness on a loaded model.

A measurement decodes a short prefix, then times passes of n = 1..8, 12 and 16
tokens at the same position (all-position logits, as verification asks for them;
the KV cache is trimmed back after each), round-robin over a few repeats so that
drift from other load hits every n alike, and keeps the median. It also runs the
*exactness probe* (:func:`probe_exactness`): the largest pass whose logits are
bitwise those of single-token decoding, which exact mode caps its passes at.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import numpy as np

from ..errors import EdgespecError
from ..runtime.kernel import KernelConfig
from . import cpu
from . import progress
from .curve import DEFAULT_KS, Calibration


#: the exactness probe: pass sizes up to this, at these amounts of cached context (short,
#: and past the 512 cells where single-token flash attention may switch to split-KV)
PROBE_MAX_TOKENS = 16
PROBE_CONTEXTS: tuple[int, ...] = (32, 600)


def context_options(kernel: KernelConfig) -> dict:
    """The ``new_context`` switches of a kernel configuration (what the engine runs)."""
    return {"flash_attn": 1 if kernel.flash_attn else 0, "type_k": kernel.kv_ggml_type,
            "type_v": kernel.kv_ggml_type}


def probe_tokens(model, n: int) -> list[int]:
    # Arbitrary but fixed ids: what a pass costs, and whether its kernels are batch
    # invariant, does not depend on what the tokens mean.
    vocab = max(int(model.n_vocab), 2)
    return [(1000 + 7919 * i) % vocab for i in range(n)]


def close_context(ctx) -> None:
    close = getattr(ctx, "close", None)
    if close:
        close()


def measure(model, *, n_threads: int | None = None, ks: Sequence[int] = DEFAULT_KS,
            repeats: int = 5, prefix_tokens: int = 64, kernel: KernelConfig | None = None,
            probe: bool = True, clock: Callable[[], float] = time.perf_counter) -> Calibration:
    """Time n-token passes of a loaded backend model and probe its exactness (see the
    module docstring); ``probe=False`` skips the probe.

    ``model`` needs ``n_vocab`` and ``new_context(n_ctx, n_batch, n_threads, **switches)``
    whose context has ``decode(tokens, pos0, logits=...)``, ``trim(seq, pos)``,
    ``clear()`` and ``close()``: a :class:`edgespec.runtime.model.Model` or a fake.
    """
    kernel = kernel or KernelConfig()
    ks = sorted(set(int(k) for k in ks) | {1})
    if ks[0] < 1:
        raise ValueError("pass sizes must be >= 1")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    kmax = ks[-1]
    try:
        watch = cpu.CpuWatch()
    except (ImportError, OSError):
        watch = None
    ctx = model.new_context(n_ctx=prefix_tokens + kmax + 8, n_batch=max(kmax, prefix_tokens),
                            n_threads=n_threads, **context_options(kernel))
    try:
        toks = probe_tokens(model, prefix_tokens + kmax)
        ctx.decode(toks[:prefix_tokens], 0, logits="last")
        pos = prefix_tokens
        samples = time_passes(ctx, toks, pos, ks, repeats, clock)
    finally:
        close_context(ctx)
    busy = watch.share() if watch is not None else 0.0
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med[1]
    if not base > 0:
        raise EdgespecError("calibration measured a zero-time pass; the clock is not advancing")
    exact = probe_exactness(model, n_threads=n_threads, kernel=kernel) if probe else None
    return Calibration(step_seconds=base, points=tuple((k, med[k] / base) for k in ks),
                       source="measured", samples={k: tuple(v) for k, v in samples.items()},
                       measured_at=time.time(), busy=busy, exact_max_tokens=exact)


def probe_exactness(model, *, n_threads: int | None = None, kernel: KernelConfig | None = None,
                    max_tokens: int = PROBE_MAX_TOKENS,
                    contexts: Sequence[int] = PROBE_CONTEXTS) -> int:
    """The largest n <= ``max_tokens`` such that every pass of 2..n tokens is exact.

    Exact: at each of ``contexts`` tokens already cached, every row of the pass's
    logits is bitwise the row single-token decoding gives the same position (the plain
    path: one token per pass, KV written one token at a time), and the next
    single-token decode after the pass is bitwise the plain path's too (the pass
    wrote the same KV). The first size that fails ends the search: exact mode needs
    every size up to its cap to hold. Returns at least 1 (a single token is the plain
    path itself). Costs a prefill of the longest context, about 2 x (max_tokens + 1)
    single-token decodes and the passes tried, with the first failure stopping early.
    """
    kernel = kernel or KernelConfig()
    if max_tokens < 1 or not contexts or min(contexts) < 1:
        raise ValueError("the probe needs max_tokens >= 1 and positive context lengths")
    repacked = getattr(model, "use_extra_bufts", kernel.repack)
    if bool(repacked) != kernel.repack:
        raise EdgespecError(
            f"the exactness probe was asked about repack={kernel.repack} on a model loaded with "
            f"repack={bool(repacked)}; load the model with the kernel configuration it will run")
    longest = max(contexts)
    toks = probe_tokens(model, longest + max_tokens + 1)
    ctx = model.new_context(n_ctx=longest + max_tokens + 8,
                            n_batch=max(kernel.n_batch, max_tokens + 1), n_threads=n_threads,
                            **context_options(kernel))
    try:
        best = max_tokens
        with progress.task("probing which pass sizes are bitwise exact",
                           total=len(contexts)) as done:
            for n_cached in sorted(contexts):
                best = min(best, _largest_exact(ctx, toks, n_cached, best))
                done.advance()
                if best <= 1:
                    break
    finally:
        close_context(ctx)
    return best


def _bits(row: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(row, dtype=np.float32).view(np.uint32)


def _largest_exact(ctx, toks: Sequence[int], n_cached: int, limit: int) -> int:
    ctx.clear()
    ctx.decode(toks[:n_cached], 0, logits="none")
    ref: list[np.ndarray] = []  # single-token logits of positions n_cached, n_cached + 1, ...

    def singles(count: int) -> None:
        # the KV beyond the cached prefix was trimmed after the last pass: rebuild it the
        # plain path's way, one token per pass
        ctx.trim(0, n_cached)
        ref.clear()
        for i in range(count):
            ref.append(_bits(ctx.decode([toks[n_cached + i]], n_cached + i, logits="last")[0]))
        ctx.trim(0, n_cached)

    for n in range(2, limit + 1):
        if len(ref) < n + 1:
            # most configurations that fail do so by 4 tokens: don't decode 17 singles first
            singles(min(limit, 4) + 1 if n <= 4 else limit + 1)
        rows = ctx.decode(list(toks[n_cached:n_cached + n]), n_cached, logits="all")
        same = all(np.array_equal(_bits(rows[i]), ref[i]) for i in range(n))
        if same:  # and the KV this pass wrote gives the next position the plain logits
            after = ctx.decode([toks[n_cached + n]], n_cached + n, logits="last")[0]
            same = np.array_equal(_bits(after), ref[n])
        ctx.trim(0, n_cached)
        if not same:
            return n - 1
    return limit


def time_passes(ctx, toks, pos: int, ks, repeats: int, clock, *, why: str = "",
                cached: bool = True) -> dict[int, list[float]]:
    """Seconds of a k-token pass after ``pos`` cached tokens, ``repeats`` times per k in
    round-robin, each pass trimmed away again; round 0 warms caches and is discarded.
    ``why`` is appended to the progress line; ``cached`` says whether the result is kept
    for later runs."""
    samples: dict[int, list[float]] = {k: [] for k in ks}
    with progress.task(f"timing verify passes of {min(ks)}-{max(ks)} tokens{why}",
                       total=(repeats + 1) * len(ks), cached=cached) as done:
        for r in range(repeats + 1):
            for k in ks:
                t0 = clock()
                ctx.decode(toks[pos:pos + k], pos, logits="all")
                dt = clock() - t0
                ctx.trim(0, pos)
                if r:
                    samples[k].append(dt)
                done.advance()
    return samples


#: the MTP head's timing: tokens of context its cache holds first, then timed 1-token decodes
HEAD_PREFIX_TOKENS = 32


def measure_head(model, *, n_threads: int | None = None, kernel: KernelConfig | None = None,
                 repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of one MTP-head decode (one token with a hidden row, logits and hidden
    state out: what the mtp proposer pays per draft token) of a target loaded with its
    NextN layers (``load_mtp``), after ``HEAD_PREFIX_TOKENS`` positions in its cache.

    The hidden rows are fixed pseudo-random values: what a decode costs does not depend on
    them (dense matrices, no data-dependent path).
    """
    from ..runtime.mtp import MtpContext  # deferred: it loads llama.cpp
    kernel = kernel or KernelConfig()
    n = HEAD_PREFIX_TOKENS
    ctx = model.new_context(n_ctx=n + 16, n_batch=max(kernel.n_batch, n), n_threads=n_threads,
                            **context_options(kernel))
    try:
        head = MtpContext(ctx, n_batch=n, flash_attn=int(kernel.flash_attn),
                          type_k=kernel.kv_ggml_type, type_v=kernel.kv_ggml_type)
        try:
            return _time_head(head, probe_tokens(model, n + 1), repeats, clock)
        finally:
            head.close()
    finally:
        close_context(ctx)


def _time_head(head, toks: Sequence[int], repeats: int, clock: Callable[[], float]) -> float:
    """Decode ``toks[:-1]`` into the head's cache, then time ``repeats`` decodes of the last
    token at the next position (each trimmed away again; the first one warms up)."""
    n = len(toks) - 1
    rows = np.random.default_rng(0).standard_normal((n + 1, head.n_embd)).astype(np.float32) * 0.1
    head.decode(list(toks[:n]), 0, rows[:n], want=False)
    samples = []
    for r in range(max(repeats, 1) + 1):
        t0 = clock()
        head.decode([toks[n]], n, rows[n:], want=True)
        dt = clock() - t0
        head.trim(n)
        if r:
            samples.append(dt)
    med = statistics.median(samples)
    if not med > 0:
        raise EdgespecError("the MTP head's timing measured a zero-time decode; the clock is "
                            "not advancing")
    return med
