"""``--record``'s depth curves, cached beside the calibrations.

A full-preset recorded run spent 31 minutes timing the same pass sizes at the same depths
before its first request, on every run. The curve depends on what a calibration depends on
(CPU, threads, offload, kernel configuration, llama.cpp build, the model's digest) and on
the depths and sizes timed, so it is keyed by all of them and kept like a calibration:

* a corrupt file, another format or another llama.cpp build: warned about, measured again;
* a curve measured while other processes held the CPUs: used while the machine is still
  busy, measured again once it is quiet (``calibration.cpu.BUSY_LIMIT``).

    curve, cached = load_or_measure(model, depths, n_threads=2, kernel=kernel)
"""
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

from ... import statefile
from ...calibration import cache, cpu
from ...calibration.curve import DEFAULT_KS, CalibrationWarning
from ...registry import digests
from ...runtime.kernel import KernelConfig
from .cost import DepthCurve
from .depth import measure_depths

FORMAT = 1


def cache_key(model_path, depths: Sequence[int], ks: Sequence[int], *, n_threads: int,
              kernel: KernelConfig, n_gpu_layers: int = 0, sha256: str | None = None,
              home: Path | None = None, build: str | None = None) -> tuple[str, str]:
    """``(key, build)``: the file name (``depths-<model>-<hash>``) and the llama.cpp build the
    curve must have been measured with (left out of the key, so another build's file is
    found, said to be stale, and replaced)."""
    timed = {"depths": ",".join(map(str, sorted({int(d) for d in depths}))),
             "ks": ",".join(map(str, sorted({int(k) for k in ks} | {1})))}
    device = cache.device_fingerprint(n_threads, n_gpu_layers, build, extra=timed, kernel=kernel)
    ident = digests.model_identity(model_path, sha256, home)
    # the calibration's own key, under a name of its own (``name``'s stem prefixes the file)
    key = cache.cache_key(device, {**ident, "name": f"depths-{Path(model_path).name}"})
    return key, device["build"]


def pattern(model_path, home: Path | None = None) -> Path:
    """Where this model's cached depth curves are (a glob, for a user who wants them gone)."""
    return cache.folder(home) / f"depths-{Path(model_path).stem}-*.json"


def load(key: str, build: str, home: Path | None = None) -> tuple[DepthCurve, float] | None:
    """The cached curve and when it was measured, or None (absent, or unusable: warned)."""
    path = cache.cache_path(key, home)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format') if isinstance(raw, dict) else None!r},"
                             f" expected {FORMAT}")
        curve = DepthCurve.from_json(raw["curve"])
        measured_at = float(raw.get("measured_at", 0.0))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        _stale(path, f"is unreadable ({e})")
        return None
    if raw.get("build") != build:
        _stale(path, f"was measured with another llama.cpp build ({raw.get('build')!r})")
        return None
    return curve, measured_at


def save(key: str, curve: DepthCurve, build: str, home: Path | None = None) -> None:
    """Keep it; a read-only or full home only loses the cache, never the run."""
    path = cache.cache_path(key, home)
    body = json.dumps({"format": FORMAT, "key": key, "build": build, "measured_at": time.time(),
                       "curve": curve.to_json()}, indent=1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        statefile.atomic_write(path, body, what="cached depth curve")
    except (OSError, statefile.StateFileError):
        pass


def load_or_measure(model, depths: Sequence[int], *, n_threads: int, kernel: KernelConfig,
                    ks: Sequence[int] = DEFAULT_KS, sha256: str | None = None,
                    home: Path | None = None, build: str | None = None, force: bool = False,
                    measure: Callable[..., DepthCurve] = measure_depths,
                    ) -> tuple[DepthCurve, float | None]:
    """``(curve, measured_at)``: ``measured_at`` is when a cached curve was measured, None
    when it was measured now. ``model`` is loaded (it has ``path``); ``measure`` replaces
    :func:`~edgespec.lab.replay.depth.measure_depths` (tests)."""
    key, build = cache_key(model.path, depths, ks, n_threads=n_threads, kernel=kernel,
                           n_gpu_layers=int(getattr(model, "n_gpu_layers", 0) or 0),
                           sha256=sha256, home=home, build=build)
    if not force:
        got = load(key, build, home)
        if got is not None:
            curve, measured_at = got
            if not cpu.measure_again(curve.busy):
                return curve, measured_at
            warnings.warn(f"the cached depth curve {key} was timed while other processes used "
                          f"{curve.busy:.0%} of the CPUs; the machine is quiet now, measuring it "
                          "again", CalibrationWarning, stacklevel=2)
    curve = measure(model, depths, n_threads=n_threads, kernel=kernel, ks=ks)
    save(key, curve, build, home)
    return curve, None


def _stale(path: Path, why: str) -> None:
    warnings.warn(f"the cached depth curve {path} {why}; measuring it again",
                  CalibrationWarning, stacklevel=3)
