"""The default mode's kernel configuration: the fastest this device has, by measurement.

Exact mode needs a batch-invariant configuration (flash attention on, a Q8_0 KV cache:
docs/parity.md) and keeps it. The default mode is lossless whatever the kernels compute,
but its greedy and seeded requests promise one text with a warm or a cold KV cache, which
needs a prefill to compute a row the same however the prompt splits into passes (``runnable``
says which candidates do): it runs the fastest such candidate. Every candidate is timed on
the loaded model, so `edgespec plan` shows what the others would give.

A measurement holds one context per candidate and times, at a few cached-context depths
(requests do not decode at position 64), a single-token step and a verify pass of
``PASS_TOKENS`` tokens, round-robin over the candidates so that drift and other load hit
them alike; filling each context up to those depths times its prompt processing too.
Score: the mean over depths of ``(step + PASS_WEIGHT * pass + PREFILL_WEIGHT * prefill)``
(``prefill``: seconds per prompt token): mostly the plain step (most steps of a request),
the verify pass the controller prices, and the prompt a request computes first. On CPUs
the prompt term separates F16 from Q8_0: flash attention over a Q8_0 cache has no tiled
batch kernel in ggml-cpu, so a 1,800-token prompt prefills at 38 tok/s against 55 with
F16 (qwen-1.5b, 2 threads), while their steps differ by a percent or two.
The result is cached beside the calibrations, keyed by model digest, device, threads,
GPU layers and weight layout; a choice measured while other processes held the CPUs is
used but measured again once the machine is quiet.

    choice = load_or_measure(model, n_threads=2, sha256=sha)
    choice.kernel        # KernelConfig the default mode runs
    choice.describe()    # one line per candidate, for `edgespec plan`
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..calibration import cache, cpu, measuring, progress
from ..calibration.curve import CalibrationWarning
from ..registry import digests
from ..runtime.kernel import KernelConfig
from ..errors import EdgespecError

if TYPE_CHECKING:
    from ..runtime.model import Model

#: what is timed: llama.cpp's CPU default (F16 KV, flash attention on) and the exact
#: configuration. Not attention without flash attention: its matmuls take other kernels for
#: one token than for a batch at every size (docs/parity.md), so the default's greedy text
#: would leave the plain path's at near-ties far more often
CANDIDATES: tuple[KernelConfig, ...] = (
    KernelConfig(kv_type="f16", flash_attn=True),
    KernelConfig(kv_type="q8_0", flash_attn=True),
)
#: the default before any measurement: the exact configuration, which serves exact requests
#: too and holds half the KV memory of F16
FALLBACK = CANDIDATES[1]
#: cached-context depths timed (a request's decode runs past its prompt)
DEPTHS: tuple[int, ...] = (256, 1024)
PASS_TOKENS = 4
PASS_WEIGHT = 0.25
#: prompt tokens a request computes per token it generates: editors and agents send
#: prompts of 500-2,000 tokens for answers of 100-300 (the grounded preset: 166-2,063 for
#: 128), less what the prefix cache reuses across turns. Two is the low end of that.
PREFILL_WEIGHT = 2.0
_FORMAT = 3  # 2: no candidate without flash attention; 3: prompt processing timed too


@dataclass(frozen=True)
class KernelTiming:
    """One candidate's median seconds per depth: a 1-token step and a PASS_TOKENS pass;
    and the seconds per prompt token of the prefill that filled the context up to it."""

    kv_type: str
    flash_attn: bool
    step: Mapping[int, float]
    pass_: Mapping[int, float]
    prefill: Mapping[int, float] = field(default_factory=dict)

    def score(self) -> float:
        return statistics.fmean(self.step[d] + PASS_WEIGHT * self.pass_[d]
                                + PREFILL_WEIGHT * self.prefill.get(d, 0.0) for d in self.step)

    def matches(self, k: KernelConfig) -> bool:
        return k.kv_type == self.kv_type and k.flash_attn == self.flash_attn


@dataclass(frozen=True)
class KernelChoice:
    """The measured candidates and the winner (``source`` "measured"), or the fallback."""

    kernel: KernelConfig
    timings: tuple[KernelTiming, ...] = ()
    source: str = "default"  # "measured" | "default" (nothing measured yet)
    busy: float = 0.0  # other processes' share of the CPUs while it was timed
    measured_at: float = 0.0
    key: str = ""
    build: str = ""  # the llama.cpp build it was measured with: another build measures again

    def timing(self, k: KernelConfig) -> KernelTiming | None:
        return next((t for t in self.timings if t.matches(k)), None)

    def describe(self) -> list[str]:
        if not self.timings:
            return [f"KV {self.kernel.kv_type}, flash attention {'on' if self.kernel.flash_attn else 'off'}"
                    " (the exact configuration; not measured here yet: `edgespec plan --calibrate`)"]
        best = min(t.score() for t in self.timings)
        out = []
        for t in sorted(self.timings, key=KernelTiming.score):
            steps = ", ".join(f"{t.step[d] * 1000:.1f} ms at {d}" for d in sorted(t.step))
            mark = "*" if t.matches(self.kernel) else " "
            deepest = max(t.step)
            prompt = (f"prompt {1 / t.prefill[deepest]:.0f} tok/s up to {deepest}; "
                      if t.prefill.get(deepest, 0) > 0 else "")
            why = "" if runnable(t) else " (not run: a warm KV cache would change a greedy text)"
            out.append(f"{mark} KV {t.kv_type:<4} flash attention {'on ' if t.flash_attn else 'off'}: "
                       f"step {steps}; {PASS_TOKENS}-token pass {t.pass_[deepest] / t.step[deepest]:.2f} "
                       f"steps; {prompt}score {t.score() / best:.3f}{why}")
        if self.busy > cpu.BUSY_LIMIT:
            out.append(f"  (measured while other processes used {self.busy:.0%} of the CPUs: "
                       "measured again once the machine is quiet)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"format": _FORMAT, "kernel": {"kv_type": self.kernel.kv_type,
                                              "flash_attn": self.kernel.flash_attn},
                "timings": [{"kv_type": t.kv_type, "flash_attn": t.flash_attn,
                             "step": {str(d): s for d, s in t.step.items()},
                             "pass": {str(d): s for d, s in t.pass_.items()},
                             "prefill": {str(d): s for d, s in t.prefill.items()}}
                            for t in self.timings],
                "busy": self.busy, "measured_at": self.measured_at, "key": self.key,
                "build": self.build}


def runnable(t: KernelTiming) -> bool:
    """Whether the default mode may run it: a greedy or seeded request promises one text
    whether the KV cache is warm or cold, and reuses only prefill-written rows for it
    (edgespec.decoding.kvcache), which needs a prefill to compute each row the same in any
    pass of at least ``min_pass`` rows (``KernelConfig.reproducible``: flash attention on.
    Over an F16 cache that takes passes of 64+ rows, the tiled attention kernel's;
    tests/integration/test_reproducible_real.py holds both caches to it)."""
    return KernelConfig(kv_type=t.kv_type, flash_attn=t.flash_attn).reproducible


def choose(timings: Sequence[KernelTiming], base: KernelConfig = FALLBACK) -> KernelConfig:
    """The runnable candidate with the lowest score, as ``base`` with its KV type and
    attention."""
    ok = [t for t in timings if runnable(t)]
    if not ok:
        return base
    t = min(ok, key=KernelTiming.score)
    return replace(base, kv_type=t.kv_type, flash_attn=t.flash_attn).validate()


def measure(model: Model, *, n_threads: int | None = None, repack: bool = True,
            candidates: Sequence[KernelConfig] = CANDIDATES, depths: Sequence[int] = DEPTHS,
            repeats: int = 4, clock: Callable[[], float] = time.perf_counter) -> KernelChoice:
    """Time every candidate on a loaded model (see the module docstring)."""
    depths = sorted(set(int(d) for d in depths))
    if not candidates or not depths or depths[0] < 1 or repeats < 1:
        raise ValueError("need candidates, positive depths and repeats >= 1")
    try:
        watch = cpu.CpuWatch()
    except (ImportError, OSError):
        watch = None
    n_ctx = depths[-1] + PASS_TOKENS + 8
    toks = measuring.probe_tokens(model, depths[-1] + PASS_TOKENS)
    ctxs: list[Any] = []
    samples: dict[tuple[int, int, int], list[float]] = {}
    try:
        for k in candidates:
            ctxs.append(model.new_context(n_ctx=n_ctx, n_batch=min(512, n_ctx), n_threads=n_threads,
                                          **measuring.context_options(k)))
        for ctx in ctxs:  # each context's first pass (its graph, first touches) is not timed
            ctx.decode(toks[:1], 0, logits="none")
            ctx.trim(0, 0)
        filled = [0] * len(ctxs)
        prefill: dict[tuple[int, int], float] = {}
        with progress.task(f"timing {len(ctxs)} kernel configurations",
                           total=len(depths) * (repeats + 1)) as done:
            for d in depths:
                for i, ctx in enumerate(ctxs):
                    t0 = clock()
                    ctx.decode(toks[filled[i]:d], filled[i], logits="none")
                    prefill[(i, d)] = (clock() - t0) / (d - filled[i])
                    filled[i] = d
                for r in range(repeats + 1):  # round 0 warms caches and is discarded
                    for i, ctx in enumerate(ctxs):
                        for n in (1, PASS_TOKENS):
                            t0 = clock()
                            ctx.decode(toks[d:d + n], d, logits="last" if n == 1 else "all")
                            dt = clock() - t0
                            ctx.trim(0, d)
                            if r:
                                samples.setdefault((i, d, n), []).append(dt)
                    done.advance()
    finally:
        for ctx in ctxs:
            measuring.close_context(ctx)
    timings = tuple(KernelTiming(
        kv_type=k.kv_type, flash_attn=k.flash_attn,
        step={d: statistics.median(samples[(i, d, 1)]) for d in depths},
        pass_={d: statistics.median(samples[(i, d, PASS_TOKENS)]) for d in depths},
        prefill={d: prefill[(i, d)] for d in depths})
        for i, k in enumerate(candidates))
    if any(not s > 0 for t in timings for s in t.step.values()):
        raise EdgespecError("the kernel measurement timed a zero-length pass; the clock is not advancing")
    base = replace(FALLBACK, repack=repack)
    return KernelChoice(kernel=choose(timings, base), timings=timings, source="measured",
                        busy=watch.share() if watch is not None else 0.0, measured_at=time.time())


# --- cache -------------------------------------------------------------------------
def cache_key(model_path: str | os.PathLike[str], *, n_threads: int, n_gpu_layers: int, repack: bool,
              sha256: str | None = None, home: Path | None = None, build: str | None = None) -> str:
    """``kernels-<model>-<hash>``: the device (CPU, threads, offload, weight layout; every
    candidate is in the file, so no KV type or attention) and the model's digest."""
    device = cache.device_fingerprint(n_threads, n_gpu_layers, "", kernel=replace(FALLBACK, repack=repack))
    device = {k: v for k, v in device.items() if k not in ("kernel", "build")}
    ident = digests.model_identity(model_path, sha256, home)
    blob = json.dumps({"device": device, "repack": repack, "sha256": ident["sha256"],
                       "size": ident.get("size", "")}, sort_keys=True)
    return f"kernels-{Path(model_path).stem}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _path(key: str, home: Path | None) -> Path:
    return cache.cache_path(key, home)


def load_cached(key: str, home: Path | None = None, base: KernelConfig = FALLBACK,
                build: str | None = None) -> KernelChoice | None:
    """The cached choice, or None (absent); a corrupt file, or one measured with another
    llama.cpp build than ``build``, warns and reads as absent."""
    path = _path(key, home)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(d, dict) and isinstance(d.get("format"), int) and d["format"] < _FORMAT:
            warnings.warn(f"the cached kernel choice {path} predates what this version times "
                          f"(format {d['format']}, now {_FORMAT}: prompt processing too); "
                          "measuring it again", CalibrationWarning, stacklevel=2)
            return None
        if d.get("format") != _FORMAT:
            raise ValueError(f"format {d.get('format')!r}, expected {_FORMAT}")
        timings = tuple(KernelTiming(
            kv_type=str(t["kv_type"]), flash_attn=bool(t["flash_attn"]),
            step={int(k): float(v) for k, v in t["step"].items()},
            pass_={int(k): float(v) for k, v in t["pass"].items()},
            prefill={int(k): float(v) for k, v in t["prefill"].items()}) for t in d["timings"])
        if not timings or any(not s > 0 for t in timings
                              for s in [*t.step.values(), *t.pass_.values(), *t.prefill.values()]):
            raise ValueError("no positive timings")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"the cached kernel choice {path} is unreadable ({e}); measuring it again",
                      CalibrationWarning, stacklevel=2)
        return None
    then = str(d.get("build", ""))
    if build is not None and then != build:
        warnings.warn(f"the cached kernel choice {path} was measured with another llama.cpp build "
                      f"({then!r}); measuring it again", CalibrationWarning, stacklevel=2)
        return None
    return KernelChoice(kernel=choose(timings, base), timings=timings, source="measured",
                        busy=float(d.get("busy", 0.0)), measured_at=float(d.get("measured_at", 0.0)),
                        key=key, build=then)


def save(choice: KernelChoice, home: Path | None = None) -> None:
    path = _path(choice.key, home)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(choice.to_json(), indent=1), encoding="utf-8")
        os.replace(tmp, path)  # readers never see half a file
    except OSError:
        pass  # a read-only home still runs the measured choice, just not a cached one


def cached(model_path: str | os.PathLike[str], *, n_threads: int | None = None, n_gpu_layers: int = 0,
           repack: bool = True, sha256: str | None = None, home: Path | None = None,
           build: str | None = None) -> KernelChoice:
    """The cached choice for this device and model, or the fallback; never measures."""
    n_threads = n_threads or _threads()
    base = replace(FALLBACK, repack=repack)
    if sha256 is None and not any(cache.folder(home).glob(f"kernels-{Path(model_path).stem}-*.json")):
        return KernelChoice(kernel=base)
    key = cache_key(model_path, n_threads=n_threads, n_gpu_layers=n_gpu_layers, repack=repack,
                    sha256=sha256, home=home, build=build)
    with warnings.catch_warnings():  # the measuring path says it; planning stays quiet
        warnings.simplefilter("ignore", CalibrationWarning)
        got = load_cached(key, home, base, build if build is not None else cache.llama_build())
    return got or KernelChoice(kernel=base)


def load_or_measure(model: Model, *, n_threads: int | None = None, sha256: str | None = None,
                    home: Path | None = None, force: bool = False, build: str | None = None,
                    **measure_kw: Any) -> KernelChoice:
    """The cached choice for the loaded ``model``, measured (and cached) when absent,
    corrupt, or measured under load while the machine is now quiet."""
    n_threads = n_threads or _threads()
    repack = bool(getattr(model, "use_extra_bufts", True))
    key = cache_key(model.path, n_threads=n_threads, n_gpu_layers=getattr(model, "n_gpu_layers", 0),
                    repack=repack, sha256=sha256, home=home, build=build)
    build = build if build is not None else cache.llama_build()
    if not force:
        got = load_cached(key, home, replace(FALLBACK, repack=repack), build)
        if got is not None and not cpu.measure_again(got.busy):
            return got
    choice = replace(measure(model, n_threads=n_threads, repack=repack, **measure_kw), key=key,
                     build=build)
    save(choice, home)
    return choice


def _threads() -> int:
    from ..runtime.backend import default_threads  # deferred: it loads llama.cpp
    return default_threads()
