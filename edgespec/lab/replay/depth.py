"""Measuring the verify-cost curve at several context depths (what a replay prices with).

:func:`edgespec.calibration.measuring.measure` times passes over a 64-token prefix; a request
decodes past its prompt, and a pass over 1,000 cached cells costs measurably more (its
attention reads every cell). This times the same batch sizes at a few depths, with the
kernel configuration the engine runs, ascending (each depth extends the prefill of the
one before), round-robin over sizes and repeats like the calibration, and keeps medians.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

from ...calibration.cpu import CpuWatch
from ...calibration.curve import DEFAULT_KS, Calibration
from ...calibration.measuring import context_options, probe_tokens, time_passes
from ...runtime.kernel import KernelConfig
from .cost import DepthCurve

#: depths measured below a run's deepest pass (that one is measured too)
BASE_DEPTHS: tuple[int, ...] = (64, 256, 1024, 4096)


def depths_for(deepest: int, n_ctx: int, kmax: int = max(DEFAULT_KS)) -> tuple[int, ...]:
    """The depths a run needs: the base depths below its deepest pass, and that one."""
    top = max(16, min(int(deepest), n_ctx - kmax - 1))
    return tuple(sorted({d for d in BASE_DEPTHS if d < top} | {top}))


def measure_depths(model, depths: Sequence[int], *, n_threads: int | None = None,
                   kernel: KernelConfig | None = None, ks: Sequence[int] = DEFAULT_KS,
                   repeats: int = 3, clock: Callable[[], float] = time.perf_counter,
                   cached: bool = True) -> DepthCurve:
    """Time ``ks``-token passes (all-position logits, as verification asks) at each depth.

    ``model`` is a loaded backend model (or a fake with the same ``new_context``).
    ``cached``: whether the caller keeps the result (:mod:`.depth_cache` does), which the
    progress line tells the user."""
    kernel = kernel or KernelConfig()
    ks = sorted({int(k) for k in ks} | {1})
    depths = sorted({int(d) for d in depths})
    if not depths or depths[0] < 1:
        raise ValueError("depths must be positive token counts")
    kmax = ks[-1]
    try:
        watch = CpuWatch()
    except (ImportError, OSError):
        watch = None
    top = depths[-1]
    ctx = model.new_context(n_ctx=top + kmax + 8, n_batch=max(kmax, min(kernel.n_batch, top)),
                            n_threads=n_threads, **context_options(kernel))
    curves = []
    try:
        toks = probe_tokens(model, top + kmax)
        pos = 0
        for i, depth in enumerate(depths, 1):
            ctx.decode(toks[pos:depth], pos, logits="none")  # extend the cached prefix
            pos = depth
            samples = time_passes(ctx, toks, depth, ks, repeats, clock, cached=cached,
                                  why=f" after {depth} cached tokens ({i} of {len(depths)} "
                                      "depths, for --record's replays)")
            med = {k: statistics.median(v) for k, v in samples.items()}
            base = med[1]
            curves.append((depth, Calibration(
                step_seconds=base, points=tuple((k, med[k] / base) for k in ks),
                source="measured", samples={k: tuple(v) for k, v in samples.items()},
                measured_at=time.time())))
    finally:
        close = getattr(ctx, "close", None)
        if close:
            close()
    return DepthCurve(tuple(curves), busy=watch.share() if watch is not None else 0.0)
