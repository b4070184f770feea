"""The calibration cache: one JSON file per device, kernel configuration and model.

A calibration is cached in :func:`edgespec.paths.calibration_dir` under a key made of
the device (CPU model, threads, GPU layers, the kernel configuration: repacked weights,
flash attention, KV type, mmap) and the model's sha256 and size. A file written by
another format, or measured with another llama.cpp build, or unreadable, is measured
again with a warning; one timed on a busy machine is measured again once it is quiet.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .. import paths, statefile
from ..errors import EdgespecError
from ..registry import digests
from ..runtime.kernel import KernelConfig
from . import cpu, measuring
from .curve import DEFAULT_KS, FORMAT, Calibration, CalibrationWarning
from importlib import metadata

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
        "build": build if build is not None else llama_build(),
    }
    if placement:
        fp["placement"] = placement
    if extra:
        fp.update({str(k): str(v) for k, v in extra.items()})
    return fp


def cache_key(device: Mapping[str, str], model: Mapping[str, str]) -> str:
    """The file a calibration lives in. The llama.cpp build is left out on purpose: a file
    from another build is found, reported stale and measured again (see :func:`load_cached`)."""
    dev = {k: v for k, v in device.items() if k != "build"}
    blob = json.dumps({"device": dev, "sha256": model["sha256"], "size": model["size"]},
                      sort_keys=True)
    return f"{Path(model.get('name', 'model')).stem}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def folder(home: Path | None) -> Path:
    """``home`` is an $EDGESPEC_HOME override (tests); None means :mod:`edgespec.paths`."""
    return Path(home) / "calibration" if home is not None else paths.calibration_dir()


def cache_path(key: str, home: Path | None = None) -> Path:
    return folder(home) / f"{key}.json"


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
        if raw.get("format") != FORMAT:
            return _unusable(path, f"was written in format {raw.get('format')!r} by another "
                             f"edgespec version (this one reads format {FORMAT})")
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
    statefile.clean_temps(path.parent)  # what killed writers left
    # readers never see half a file; a full disk is a StateFileError, the old file stays
    return statefile.atomic_write(path, json.dumps(cal.to_json(), indent=1),
                                  what="cached calibration")


def cached(model_path: str | os.PathLike, *, n_threads: int | None = None,
           n_gpu_layers: int = 0, kernel: KernelConfig | None = None, sha256: str | None = None,
           home: Path | None = None, build: str | None = None) -> Calibration | None:
    """The usable cached calibration for this device, kernel configuration and model, or
    None; never measures (for the planner). Hashes the model only if some calibration of a
    file with its name exists."""
    if n_threads is None:
        from ..runtime.backend import default_threads  # deferred: it loads llama.cpp
        n_threads = default_threads()
    if sha256 is None and not any(folder(home).glob(f"{Path(model_path).stem}-*.json")):
        return None
    device = device_fingerprint(n_threads, n_gpu_layers, build, kernel=kernel)
    key = cache_key(device, digests.model_identity(model_path, sha256, home))
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
    ident = digests.model_identity(model_path, sha256, home)
    key = cache_key(device, ident)
    head = _Head(model_path, nextn_layers(model_path), n_threads, n_gpu_layers, kernel, repeats,
                 loader)
    if not force:
        cal = load_cached(key, home, device["build"])
        if cal is not None and not cpu.measure_again(cal.busy):
            return head.completed(cal, model, home)
        if cal is not None:
            warnings.warn(f"the cached calibration {key} was timed while other processes used "
                          f"{cal.busy:.0%} of the CPUs; the machine is quiet now, measuring it "
                          "again", CalibrationWarning, stacklevel=2)
    owned = model is None
    if owned:
        model = head.load()
    try:
        cal = measuring.measure(model, n_threads=n_threads, ks=ks, repeats=repeats, kernel=kernel)
        cal = replace(cal, key=key, device=device, model=ident, mtp_step_seconds=head.time(model))
    finally:
        if owned and hasattr(model, "close"):
            model.close()
    _save_quietly(cal, home)
    return cal


def _save_quietly(cal: Calibration, home: Path | None) -> None:
    try:
        save(cal, home)
    except (OSError, statefile.StateFileError):
        pass  # a read-only or full home still gets a calibration, just not a cached one


def nextn_layers(model_path: str | os.PathLike) -> int:
    """The NextN (MTP) layers the file's header declares; 0 when it has none or the header
    cannot be read (the curve's own load reports an unusable file)."""
    from ..runtime.gguf_facts import read_facts  # deferred: only a calibration reads headers
    try:
        return read_facts(model_path).nextn_predict_layers
    except (EdgespecError, OSError, ValueError):
        return 0


class _Head:
    """The MTP head's cost per draft token for a target with NextN layers, measured beside
    its curve and cached in the same file (:func:`measuring.measure_head`)."""

    def __init__(self, path, nextn: int, n_threads: int | None, n_gpu_layers: int,
                 kernel: KernelConfig, repeats: int, loader: Callable | None) -> None:
        self.path, self.nextn, self.n_threads = path, nextn, n_threads
        self.n_gpu_layers, self.kernel, self.repeats, self.loader = (n_gpu_layers, kernel,
                                                                      repeats, loader)

    def load(self):
        """The model, with its NextN layers when it has some (one load serves both)."""
        loader = self.loader
        if loader is None:
            from ..runtime.model import load_model as loader  # deferred: it loads llama.cpp
        extra = {"load_mtp": True} if self.nextn > 0 else {}
        return loader(self.path, n_gpu_layers=self.n_gpu_layers,
                      use_extra_bufts=self.kernel.repack, **extra)

    def time(self, model) -> float | None:
        """Seconds of one head decode, or None (no head; a model loaded without it)."""
        if self.nextn <= 0 or not getattr(model, "load_mtp", False):
            return None
        return measuring.measure_head(model, n_threads=self.n_threads, kernel=self.kernel,
                                      repeats=self.repeats)

    def completed(self, cal: Calibration, model, home: Path | None) -> Calibration:
        """A cached ``cal`` with the head's cost, measured now when it lacks it and a model
        with the head is at hand (``model``, or one loaded here when none is given); a
        model loaded without its head is not loaded twice: the cost waits for a later one."""
        if self.nextn <= 0 or cal.mtp_step_seconds is not None:
            return cal
        owned = model is None
        if owned:
            model = self.load()
        try:
            seconds = self.time(model)
        finally:
            if owned and hasattr(model, "close"):
                model.close()
        if seconds is None:
            return cal
        cal = replace(cal, mtp_step_seconds=seconds)
        _save_quietly(cal, home)
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


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def llama_build() -> str:
    """llama-cpp-python's version plus llama.cpp's feature string (AVX2, AMX...)."""
    try:
        from ..runtime.backend import system_info  # deferred: it loads llama.cpp
        info = system_info()
        return f"{info.get('llama_cpp_python', '?')} {info.get('system_info', '')}".strip()
    except Exception:
        try:
            return metadata.version("llama_cpp_python")
        except Exception:
            return "unknown"
