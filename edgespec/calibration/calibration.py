"""What a target pass over n tokens costs on this device, and up to which size its logits are exact.

Speculation pays only when the tokens a draft is expected to yield outrun the
extra cost of verifying it, and that cost is a property of the device: on a
2-core CPU verifying 7 drafts (an 8-token batch) costs about 3 plain steps, on a
GPU about one. The curve is not monotone either: with repacked weights a 3-token
pass goes through ``gemv`` and a 4-token one through the 4-column ``gemm``, which
costs less. So the controller and the planner read a measured curve as it is.

Convention (used everywhere in edgespec): ``n`` counts *every token in the
batch*. A plain step is a 1-token pass (the last emitted token); verifying a
draft of ``d`` tokens is an ``n = d + 1`` pass (the last emitted token followed
by the ``d`` drafts), so its cost is ``cost(d + 1)``, which
:meth:`Calibration.verify_cost` spells out. ``cost(1) == 1`` by definition.

A measurement decodes a short prefix, then times passes of n = 1..8, 12 and 16
tokens at the same position (all-position logits, as verification asks for them;
the KV cache is trimmed back after each), round-robin over a few repeats so that
drift from other load hits every n alike, and keeps the median. It also runs the
*exactness probe* (:func:`probe_exactness`): the largest pass whose logits are
bitwise those of single-token decoding, which exact mode caps its passes at.

The result is cached as JSON in :func:`edgespec.paths.calibration_dir` under a
key made of the device (CPU model, threads, GPU layers, the kernel
configuration: repacked weights, flash attention, KV type, mmap) and the model's
sha256 and size. A file written by another format, or measured with another
llama.cpp build, or unreadable, is measured again with a warning.

    cal = load_or_measure("~/.cache/edgespec/models/qwen-1.5b.gguf", n_threads=2)
    cal.cost(4)            # relative cost of a 4-token pass (3 drafts)
    cal.verify_cost(3)     # the same, named by the number of drafts
    cal.seconds(1)         # one plain step, in seconds
    exact_cap(model, KernelConfig(), 2)   # drafts per pass that keep logits bitwise exact
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .. import paths
from ..runtime.kernel import KernelConfig
from ..errors import EdgespecError

#: batch sizes a calibration measures (tokens per pass): every size up to 8, where kernel
#: switches make the curve jump (gemv below 4 columns, gemm from 4, tiled from 8)
DEFAULT_KS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)

#: the exactness probe: pass sizes up to this, at these amounts of cached context (short,
#: and past the 512 cells where single-token flash attention may switch to split-KV)
PROBE_MAX_TOKENS = 16
PROBE_CONTEXTS: tuple[int, ...] = (32, 600)

#: Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, on the 2-core CPU this project is developed on
#: (docs/models.md); the controller's assumption until a measurement exists.
PRIOR_CPU_COSTS: dict[int, float] = {1: 1.0, 2: 1.50, 3: 1.78, 5: 2.06, 6: 2.36, 8: 2.86,
                                     10: 3.28, 16: 3.44}
PRIOR_CPU_STEP_SECONDS = 0.086
# weight bytes of the model that step was measured on (Qwen2.5-Coder-1.5B Q4_K_M)
PRIOR_CPU_WEIGHT_BYTES = 1_111_370_240


def prior_step_seconds(weight_bytes: float) -> float:
    """The documented CPU step scaled to a model's size: decode is bandwidth-bound."""
    return PRIOR_CPU_STEP_SECONDS * weight_bytes / PRIOR_CPU_WEIGHT_BYTES


#: bump when the file layout or what is measured changes: older files are measured again
_FORMAT = 2


class CalibrationWarning(UserWarning):
    """A cached calibration could not be used (stale or corrupt) and is being measured again."""


@dataclass(frozen=True)
class Calibration:
    """A device's cost curve for one model: ``cost(n)`` = time of an n-token pass / time of a 1-token pass.

    ``points`` are the measured (n, relative cost) pairs, sorted, starting at
    (1, 1.0), kept as measured: a longer batch may cost less when it takes a
    faster kernel (no cost is below a 1-token pass's). Between points the cost is
    linear in n; beyond the last one it continues along the last segment's slope,
    never falling. ``exact_max_tokens`` is the probed exactness limit (None: not
    probed, e.g. a prior or synthetic curve).
    """

    step_seconds: float  # median wall time of a 1-token pass
    points: tuple[tuple[int, float], ...]
    key: str = ""  # cache key this calibration was stored under ("" when not cached)
    source: str = "measured"  # "measured" | "prior" | "synthetic"
    device: Mapping[str, str] = field(default_factory=dict)
    model: Mapping[str, str] = field(default_factory=dict)
    samples: Mapping[int, tuple[float, ...]] = field(default_factory=dict)  # n -> raw seconds
    measured_at: float = 0.0
    # 1-minute load average per logical CPU when the measurement started; above 1 the
    # machine was oversubscribed and the numbers are suspect (see load_or_measure)
    busy: float = 0.0  # other processes' share of the CPUs while it was timed
    exact_max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.step_seconds > 0:
            raise ValueError(f"step_seconds must be positive (got {self.step_seconds})")
        pts = sorted((int(n), float(c)) for n, c in self.points if int(n) >= 1)
        if not pts or pts[0][0] != 1:
            pts.insert(0, (1, 1.0))
        clean: list[tuple[int, float]] = []
        for n, c in pts:
            if clean and clean[-1][0] == n:
                continue
            clean.append((n, 1.0 if n == 1 else max(c, 1.0)))
        object.__setattr__(self, "points", tuple(clean))

    # --- constructors --------------------------------------------------------
    @classmethod
    def from_costs(cls, costs: Mapping[int, float], step_seconds: float, **kw) -> "Calibration":
        """From a {n: relative cost} table (tests, simulations, a planner's assumption)."""
        kw.setdefault("source", "synthetic")
        return cls(step_seconds=step_seconds, points=tuple(costs.items()), **kw)

    @classmethod
    def prior_cpu(cls, step_seconds: float = PRIOR_CPU_STEP_SECONDS) -> "Calibration":
        """The 2-core CPU curve from docs/models.md: what to assume before measuring."""
        return cls(step_seconds=step_seconds, points=tuple(PRIOR_CPU_COSTS.items()), source="prior")

    @classmethod
    def linear(cls, per_token: float, step_seconds: float = 0.02, upto: int = 16) -> "Calibration":
        """cost(n) = 1 + per_token * (n - 1): per_token≈0 is a GPU-like device, 1 is fully compute-bound."""
        return cls.from_costs({n: 1.0 + per_token * (n - 1) for n in range(1, upto + 1)},
                              step_seconds)

    # --- queries -------------------------------------------------------------
    def cost(self, n: float) -> float:
        """Relative cost of a pass over ``n`` tokens (n >= 1; fractional n interpolates)."""
        if n < 1:
            raise ValueError(f"a pass has at least one token (got n={n})")
        pts = self.points
        if len(pts) == 1:
            return 1.0
        for (n0, c0), (n1, c1) in zip(pts, pts[1:]):
            if n <= n1:
                return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
        (n0, c0), (n1, c1) = pts[-2], pts[-1]
        # past the measured range (a batch of several sequences' drafts) a pass is assumed
        # compute-bound at no less than the average per-token cost so far: a last segment
        # that dips (a kernel change) must not make every further position look free
        return c1 + max((c1 - c0) / (n1 - n0), c1 / n1) * (n - n1)

    def verify_cost(self, drafted: int) -> float:
        """Relative cost of verifying ``drafted`` draft tokens: a (drafted + 1)-token pass."""
        return self.cost(drafted + 1)

    def seconds(self, n: float) -> float:
        """Wall time of an n-token pass."""
        return self.step_seconds * self.cost(n)

    @property
    def max_measured(self) -> int:
        return self.points[-1][0]

    @property
    def exact_max_drafts(self) -> int | None:
        """Drafts a verify pass may hold and stay bitwise exact (None: not probed)."""
        return None if self.exact_max_tokens is None else max(self.exact_max_tokens - 1, 0)

    # --- persistence ---------------------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        d["format"] = _FORMAT
        d["points"] = [list(p) for p in self.points]
        d["samples"] = {str(k): list(v) for k, v in self.samples.items()}
        d["device"] = dict(self.device)
        d["model"] = dict(self.model)
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "Calibration":
        if d.get("format") != _FORMAT:
            raise ValueError(f"unknown calibration format {d.get('format')!r}")
        exact = d.get("exact_max_tokens")
        return cls(step_seconds=float(d["step_seconds"]),
                   points=tuple((int(n), float(c)) for n, c in d["points"]),
                   key=str(d.get("key", "")), source=str(d.get("source", "measured")),
                   device={str(k): str(v) for k, v in d.get("device", {}).items()},
                   model={str(k): str(v) for k, v in d.get("model", {}).items()},
                   samples={int(k): tuple(float(x) for x in v)
                            for k, v in d.get("samples", {}).items()},
                   measured_at=float(d.get("measured_at", 0.0)), busy=float(d.get("busy", 0.0)),
                   exact_max_tokens=None if exact is None else int(exact))


# --- measuring ---------------------------------------------------------------
def context_options(kernel: KernelConfig) -> dict:
    """The ``new_context`` switches of a kernel configuration (what the engine runs)."""
    return {"flash_attn": 1 if kernel.flash_attn else 0, "type_k": kernel.kv_ggml_type,
            "type_v": kernel.kv_ggml_type}


def _probe_tokens(model, n: int) -> list[int]:
    # Arbitrary but fixed ids: what a pass costs, and whether its kernels are batch
    # invariant, does not depend on what the tokens mean.
    vocab = max(int(model.n_vocab), 2)
    return [(1000 + 7919 * i) % vocab for i in range(n)]


def _close(ctx) -> None:
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
    ``clear()`` and ``close()``: the real :mod:`edgespec.runtime.backend` or a fake.
    """
    kernel = kernel or KernelConfig()
    ks = sorted(set(int(k) for k in ks) | {1})
    if ks[0] < 1:
        raise ValueError("pass sizes must be >= 1")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    kmax = ks[-1]
    try:
        watch = CpuWatch()
    except (ImportError, OSError):
        watch = None
    ctx = model.new_context(n_ctx=prefix_tokens + kmax + 8, n_batch=max(kmax, prefix_tokens),
                            n_threads=n_threads, **context_options(kernel))
    try:
        toks = _probe_tokens(model, prefix_tokens + kmax)
        ctx.decode(toks[:prefix_tokens], 0, logits="last")
        pos = prefix_tokens
        samples = time_passes(ctx, toks, pos, ks, repeats, clock)
    finally:
        _close(ctx)
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
    toks = _probe_tokens(model, longest + max_tokens + 1)
    ctx = model.new_context(n_ctx=longest + max_tokens + 8,
                            n_batch=max(kernel.n_batch, max_tokens + 1), n_threads=n_threads,
                            **context_options(kernel))
    try:
        best = max_tokens
        for n_cached in sorted(contexts):
            best = min(best, _largest_exact(ctx, toks, n_cached, best))
            if best <= 1:
                break
    finally:
        _close(ctx)
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


# --- identity and cache --------------------------------------------------------
def device_fingerprint(n_threads: int | None, n_gpu_layers: int = 0,
                       build: str | None = None, extra: Mapping[str, str] | None = None,
                       kernel: KernelConfig | None = None, placement: str = "") -> dict:
    """What makes a cost curve and an exactness limit valid: the CPU, the threads, offload
    (and an RPC split's servers, ``placement``), the kernel configuration and the llama.cpp
    build."""
    fp = {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "logical_cpus": str(os.cpu_count() or 0),
        "threads": str(n_threads or 0),
        "gpu_layers": str(n_gpu_layers),
        "kernel": (kernel or KernelConfig()).key(),
        "build": build if build is not None else _llama_build(),
    }
    if placement:
        fp["placement"] = placement
    if extra:
        fp.update({str(k): str(v) for k, v in extra.items()})
    return fp


def model_identity(path: str | os.PathLike, sha256: str | None = None,
                   home: Path | None = None) -> dict:
    """{"sha256", "size", "name"} of a model file; the digest is cached by (path, size, mtime)."""
    p = Path(path).expanduser().resolve()
    try:
        st = p.stat()
    except OSError as e:
        raise EdgespecError(f"cannot read model file {p}: {e.strerror}") from None
    if sha256 is None:
        sha256 = _cached_digest(p, st, _folder(home) / "digests.json")
    return {"sha256": sha256, "size": str(st.st_size), "name": p.name}


def cache_key(device: Mapping[str, str], model: Mapping[str, str]) -> str:
    """The file a calibration lives in. The llama.cpp build is left out on purpose: a file
    from another build is found, reported stale and measured again (see :func:`load_cached`)."""
    dev = {k: v for k, v in device.items() if k != "build"}
    blob = json.dumps({"device": dev, "sha256": model["sha256"], "size": model["size"]},
                      sort_keys=True)
    return f"{Path(model.get('name', 'model')).stem}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _folder(home: Path | None) -> Path:
    """``home`` is an $EDGESPEC_HOME override (tests); None means :mod:`edgespec.paths`."""
    return Path(home) / "calibration" if home is not None else paths.calibration_dir()


def cache_path(key: str, home: Path | None = None) -> Path:
    return _folder(home) / f"{key}.json"


def load_cached(key: str, home: Path | None = None, build: str | None = None) -> Calibration | None:
    """The stored calibration for ``key``, or None when there is none or it cannot be used.

    A corrupt file, one of another format, or (given ``build``) one measured with
    another llama.cpp build is reported with a :class:`CalibrationWarning` that says it
    will be measured again, and ignored.
    """
    path = cache_path(key, home)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        return _unusable(path, f"cannot be read ({e.strerror})")
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        if raw.get("format") != _FORMAT:
            return _unusable(path, f"was written in format {raw.get('format')!r} by another "
                             f"edgespec version (this one reads format {_FORMAT})")
        cal = Calibration.from_json(raw)
    except (ValueError, KeyError, TypeError) as e:
        return _unusable(path, f"is corrupt ({e})")
    then = cal.device.get("build")
    if build is not None and then != build:
        return _unusable(path, f"was measured with another llama.cpp build ({then!r}; this is "
                         f"{build!r})")
    return cal


def _unusable(path: Path, why: str) -> None:
    warnings.warn(f"the cached calibration {path} {why}; measuring it again",
                  CalibrationWarning, stacklevel=3)
    return None


def save(cal: Calibration, home: Path | None = None) -> Path:
    if not cal.key:
        raise ValueError("only a keyed calibration can be cached")
    path = cache_path(cal.key, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal.to_json(), indent=1), encoding="utf-8")
    os.replace(tmp, path)  # readers never see half a file
    return path


def cached(model_path: str | os.PathLike, *, n_threads: int | None = None,
           n_gpu_layers: int = 0, kernel: KernelConfig | None = None, sha256: str | None = None,
           home: Path | None = None, build: str | None = None) -> Calibration | None:
    """The usable cached calibration for this device, kernel configuration and model, or
    None; never measures (for the planner). Hashes the model only if some calibration of a
    file with its name exists."""
    if n_threads is None:
        from ..runtime.backend import default_threads  # deferred: it loads llama.cpp
        n_threads = default_threads()
    if sha256 is None and not any(_folder(home).glob(f"{Path(model_path).stem}-*.json")):
        return None
    device = device_fingerprint(n_threads, n_gpu_layers, build, kernel=kernel)
    key = cache_key(device, model_identity(model_path, sha256, home))
    return load_cached(key, home, device["build"])


def load_or_measure(model_path: str | os.PathLike, *, n_threads: int | None = None,
                    n_gpu_layers: int = 0, model=None, sha256: str | None = None,
                    ks: Sequence[int] = DEFAULT_KS, repeats: int = 5, force: bool = False,
                    home: Path | None = None, build: str | None = None,
                    loader: Callable | None = None,
                    kernel: KernelConfig | None = None) -> Calibration:
    """The cached calibration for this device, kernel configuration and model, measuring
    (and caching) it if absent, stale or corrupt.

    Pass the already loaded ``model`` (loaded with ``kernel.repack``) to avoid loading it
    twice, and the registry's ``sha256`` to avoid hashing the file. ``loader`` replaces
    ``runtime.model.load_model`` (tests). A curve measured while the machine was
    oversubscribed is used until the machine is found quiet, then measured again: on a
    shared CPU, contention (OpenMP threads waiting on descheduled siblings) can inflate a
    pass a hundredfold.
    """
    kernel = kernel or KernelConfig()
    if n_threads is None:
        from ..runtime.backend import default_threads  # deferred: it loads llama.cpp
        n_threads = default_threads()
    device = device_fingerprint(n_threads, n_gpu_layers, build, kernel=kernel,
                                placement=getattr(model, "placement", "") or "")
    ident = model_identity(model_path, sha256, home)
    key = cache_key(device, ident)
    if not force:
        cal = load_cached(key, home, device["build"])
        if cal is not None and not (cal.busy > BUSY_LIMIT and machine_busy() <= BUSY_LIMIT / 2):
            return cal
        if cal is not None:
            warnings.warn(f"the cached calibration {key} was timed while other processes used "
                          f"{cal.busy:.0%} of the CPUs; the machine is quiet now, measuring it "
                          "again", CalibrationWarning, stacklevel=2)
    owned = model is None
    if owned:
        if loader is None:
            from ..runtime.model import load_model as loader  # deferred: it loads llama.cpp
        model = loader(model_path, n_gpu_layers=n_gpu_layers, use_extra_bufts=kernel.repack)
    try:
        cal = measure(model, n_threads=n_threads, ks=ks, repeats=repeats, kernel=kernel)
    finally:
        if owned and hasattr(model, "close"):
            model.close()
    cal = replace(cal, key=key, device=device, model=ident)
    try:
        save(cal, home)
    except OSError:
        pass  # a read-only home still gets a calibration, just not a cached one
    return cal


def exact_cap(model, kernel: KernelConfig, n_threads: int | None, *, sha256: str | None = None,
              home: Path | None = None) -> int:
    """Drafts a verify pass may hold in exact mode on this device: the probed exactness
    limit minus the pending token (0: no pass beyond one token is exact, so exact mode
    cannot speculate). Read from the calibration cache; measured when missing, once per
    device, model and kernel configuration (the probe's ~600-token prefill dominates:
    about a second for SmolLM2-135M, ten for a 1.5B model on 2 CPU cores)."""
    cal = load_or_measure(model.path, n_threads=n_threads,
                          n_gpu_layers=getattr(model, "n_gpu_layers", 0), model=model,
                          sha256=sha256, home=home, kernel=kernel)
    if cal.exact_max_tokens is None:  # pragma: no cover - every measured calibration probes
        raise EdgespecError("the calibration has no exactness probe; run `edgespec plan "
                            "--recalibrate`")
    return cal.exact_max_drafts


#: Other processes' share of the CPUs above which a timing is not trusted: llama.cpp's
#: threads wait for each other, so a core taken by someone else slows every pass.
BUSY_LIMIT = 0.25


class CpuWatch:
    """Other processes' share of this machine's CPUs between start and :meth:`share`.

    The load average lags by minutes (a machine that just went quiet still reads busy);
    this counts the CPU time actually spent by everyone else while we measured."""

    def __init__(self) -> None:
        import psutil
        self._psutil = psutil
        self._me = psutil.Process()
        self._t0 = time.perf_counter()
        self._all0 = self._busy_all()
        self._me0 = self._busy_me()

    def _busy_all(self) -> float:
        t = self._psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + \
            getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)

    def _busy_me(self) -> float:
        t = self._me.cpu_times()
        return t.user + t.system

    def share(self) -> float:
        wall = time.perf_counter() - self._t0
        if wall <= 0:
            return 0.0
        others = (self._busy_all() - self._all0) - (self._busy_me() - self._me0)
        return max(0.0, others / (wall * (os.cpu_count() or 1)))


def time_passes(ctx, toks, pos: int, ks, repeats: int, clock) -> dict[int, list[float]]:
    """Seconds of a k-token pass after ``pos`` cached tokens, ``repeats`` times per k in
    round-robin, each pass trimmed away again; round 0 warms caches and is discarded."""
    samples: dict[int, list[float]] = {k: [] for k in ks}
    for r in range(repeats + 1):
        for k in ks:
            t0 = clock()
            ctx.decode(toks[pos:pos + k], pos, logits="all")
            dt = clock() - t0
            ctx.trim(0, pos)
            if r:
                samples[k].append(dt)
    return samples


def machine_busy(seconds: float = 0.3) -> float:
    """Other processes' share of the CPUs over the next ``seconds`` (0.0 where unknown)."""
    try:
        w = CpuWatch()
    except (ImportError, OSError):
        return 0.0
    time.sleep(seconds)
    return w.share()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _llama_build() -> str:
    """llama-cpp-python's version plus llama.cpp's feature string (AVX2, AMX...)."""
    try:
        from ..runtime.backend import system_info  # deferred: it loads llama.cpp
        info = system_info()
        return f"{info.get('llama_cpp_python', '?')} {info.get('system_info', '')}".strip()
    except Exception:
        try:
            from importlib.metadata import version
            return version("llama_cpp_python")
        except Exception:
            return "unknown"


def _cached_digest(path: Path, st: os.stat_result, store: Path) -> str:
    stamp = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(stamp), str):
        return known[stamp]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        known = known if isinstance(known, dict) else {}
        known[stamp] = digest
        tmp = store.with_suffix(".tmp")
        tmp.write_text(json.dumps(known, indent=1), encoding="utf-8")
        os.replace(tmp, store)
    except OSError:
        pass
    return digest


def summarize(cal: Calibration, ns: Iterable[int] = DEFAULT_KS) -> str:
    """One line for logs and `edgespec plan`: step time and the relative costs."""
    parts = " ".join(f"{n}:{cal.cost(n):.2f}" for n in ns)
    note = (f", measured under load (others used {cal.busy:.0%} of the CPUs)"
            if cal.busy > BUSY_LIMIT else "")
    return f"1-token pass {cal.step_seconds * 1000:.1f} ms; cost by batch size {parts} ({cal.source}{note})"
