"""What the machine offers a model: CPU cores and ISA, free RAM, accelerators.

:func:`probe` looks at this machine without loading a model: cores and free
memory through psutil (capped by a cgroup memory limit when one is set, since
a container's limit, not the host's RAM, is what an allocation runs into), ISA
flags from ``/proc/cpuinfo``, and the GPU/Metal/Vulkan devices the installed
llama.cpp was built with, through its backend device API (asked via
:func:`edgespec.runtime.ggml_devices.list_devices`; an install without llama.cpp simply has
no accelerators).

:func:`from_json` builds the same :class:`Device` from a description, so the
planner can be asked about a machine that is not this one (``edgespec plan
--device-json gpu.json``)::

    {
      "name": "laptop with an 8 GB GPU",
      "cpu": {"model": "Ryzen 7", "cores": 8, "flags": ["avx2", "fma"]},
      "ram_total": "32GiB", "ram_available": "24GiB",
      "gpus": [{"name": "RTX 4060", "type": "gpu", "free": "7.5GiB", "total": "8GiB"}],
      "speed": {"verify_costs": {"2": 1.02, "4": 1.05, "8": 1.12, "16": 1.3},
                "step_ms": 12, "draft_step_ratio": 0.25}
    }

``"huge_pages": true`` says anonymous memory can go on transparent huge pages (Linux).
Every key is optional; sizes are bytes or strings such as ``"4GiB"``. The
``speed`` block stands in for a calibration the described machine cannot run
here: the relative cost of an n-token target pass, the one-token step time,
and a draft token's cost as a fraction of a target step.
"""
from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import EdgespecError, InvalidInputError
from .hugepages import available as huge_pages_available
from .llama_build import _cpuinfo
import psutil

# The ISA features llama.cpp's CPU kernels dispatch on; the rest of /proc/cpuinfo is noise here.
ISA_FLAGS = ("sse3", "ssse3", "sse4_1", "sse4_2", "fma", "f16c", "avx", "avx2", "avx_vnni",
             "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_int8", "amx_bf16",
             # arm
             "neon", "asimd", "asimddp", "asimdhp", "sve", "sve2", "i8mm", "bf16")

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float) -> int:
    """Bytes from ``4GiB``, ``512 MiB``, ``1.5G`` (SI: G = 10^9) or a plain number of bytes."""
    if isinstance(text, bool):
        raise InvalidInputError(f"not a memory size: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise InvalidInputError(f"a memory size cannot be negative (got {text})")
        return int(text)
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise InvalidInputError(f"not a memory size: {text!r}; write e.g. 4GiB, 512MiB or 2G")
    return int(float(m.group(1)) * _UNITS[unit])


def fmt_size(n: float) -> str:
    """Binary units with three significant digits: 1.04 GiB, 896 MiB, 12.0 KiB."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            v = n / scale
            return f"{sign}{v:.3g} {unit}" if v < 1000 else f"{sign}{v:.0f} {unit}"
    return f"{sign}{int(n)} B"


@dataclass(frozen=True)
class Accelerator:
    """A non-CPU device llama.cpp can offload to."""
    name: str
    kind: str           # "gpu" | "igpu" | "accel"
    free_bytes: int
    total_bytes: int
    description: str = ""


@dataclass(frozen=True)
class Device:
    name: str
    cpu_model: str
    cores: int                    # physical cores (the thread count llama.cpp decodes best with)
    logical_cpus: int
    isa: tuple[str, ...]
    ram_total: int
    ram_available: int
    accelerators: tuple[Accelerator, ...] = ()
    synthetic: bool = False       # described by JSON, not probed
    # stand-ins for calibration on a described machine (see the module docstring)
    speed: Mapping = field(default_factory=dict)
    # anonymous memory can be put on transparent huge pages (edgespec.runtime.hugepages)
    huge_pages: bool = False

    @property
    def gpu(self) -> Accelerator | None:
        """The accelerator with the most free memory (where the target goes), or None."""
        return max(self.accelerators, key=lambda a: a.free_bytes, default=None)

    def summary(self) -> str:
        isa = ", ".join(f for f in self.isa if f in ("avx2", "avx512f", "amx_int8", "neon", "sve")) or "baseline"
        gpus = "; ".join(f"{a.name} ({a.kind}, {fmt_size(a.free_bytes)} free of {fmt_size(a.total_bytes)})"
                         for a in self.accelerators) or "no GPU"
        origin = "described" if self.synthetic else "probed"
        return (f"{self.name} ({origin}): {self.cpu_model}, {self.cores} cores [{isa}], "
                f"RAM {fmt_size(self.ram_available)} available of {fmt_size(self.ram_total)}; {gpus}")


def probe(with_accelerators: bool = True) -> Device:
    """This machine, now. Accelerators come from llama.cpp's device list when it is importable."""

    vm = psutil.virtual_memory()
    total, avail = vm.total, vm.available
    limit, usage = _cgroup_memory()
    if limit is not None and limit < total:
        total = limit
        avail = max(0, min(avail, limit - (usage or 0)))
    cpu_model, flags = _cpuinfo()
    if not flags and platform.machine().lower() in ("arm64", "aarch64"):
        # macOS has no /proc/cpuinfo; every arm64 Mac (and aarch64 board llama.cpp targets)
        # has NEON with dot products, which decides the repacked kernels (planner/repack.py)
        flags = {"neon", "asimd", "asimddp"}
    accels = _accelerators() if with_accelerators else ()
    return Device(
        name=platform.node() or "this machine",
        cpu_model=cpu_model,
        cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        logical_cpus=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        ram_total=int(total), ram_available=int(avail), accelerators=accels,
        huge_pages=huge_pages_available(),
    )


def from_json(source: str | os.PathLike | Mapping) -> Device:
    """A described device (file path, JSON text or a dict); missing fields default to this machine's."""
    if isinstance(source, Mapping):
        d = dict(source)
    else:
        text = str(source)
        try:
            if not text.lstrip().startswith("{"):
                text = Path(source).read_text(encoding="utf-8")
            d = json.loads(text)
        except OSError as e:
            raise InvalidInputError(f"cannot read device description {source}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"device description {source} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise InvalidInputError("a device description is a JSON object (see `edgespec plan --help`)")

    here = None

    def local() -> Device:
        nonlocal here
        if here is None:
            here = probe(with_accelerators=False)
        return here

    cpu = d.get("cpu") or {}
    if not isinstance(cpu, dict):
        raise InvalidInputError("device description: 'cpu' must be an object")
    ram_total = parse_size(d["ram_total"]) if "ram_total" in d else local().ram_total
    ram_avail = parse_size(d["ram_available"]) if "ram_available" in d else min(ram_total, local().ram_available)
    accels = []
    for i, g in enumerate(d.get("gpus") or []):
        if not isinstance(g, dict) or "total" not in g and "free" not in g:
            raise InvalidInputError(f"device description: gpus[{i}] needs at least 'free' or 'total'")
        total = parse_size(g.get("total", g.get("free")))
        free = parse_size(g.get("free", total))
        kind = str(g.get("type", "gpu")).lower()
        if kind not in ("gpu", "igpu", "accel"):
            raise InvalidInputError(f"device description: gpus[{i}].type must be gpu, igpu or accel")
        accels.append(Accelerator(name=str(g.get("name", f"GPU{i}")), kind=kind, free_bytes=free,
                                  total_bytes=max(total, free), description=str(g.get("description", ""))))
    speed = d.get("speed") or {}
    if not isinstance(speed, dict):
        raise InvalidInputError("device description: 'speed' must be an object")
    flags = cpu.get("flags")
    return Device(
        name=str(d.get("name", "described device")),
        cpu_model=str(cpu.get("model", "unspecified CPU" if "cores" in cpu else local().cpu_model)),
        cores=int(cpu.get("cores") or local().cores),
        logical_cpus=int(cpu.get("logical_cpus") or cpu.get("cores") or local().logical_cpus),
        isa=tuple(str(f).lower() for f in flags) if isinstance(flags, list) else local().isa,
        ram_total=ram_total, ram_available=ram_avail, accelerators=tuple(accels),
        synthetic=True, speed=speed,
        huge_pages=bool(d["huge_pages"]) if "huge_pages" in d else local().huge_pages,
    )


# --- probes ------------------------------------------------------------------------
def _cgroup_memory() -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup, v2 or v1; (None, None) when unlimited."""
    for limit_f, usage_f in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                             ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                              "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            raw = Path(limit_f).read_text().strip()
        except OSError:
            continue
        if raw == "max" or not raw.isdigit() or int(raw) >= 1 << 60:
            return None, None
        try:
            usage = int(Path(usage_f).read_text().strip())
        except (OSError, ValueError):
            usage = None
        return int(raw), usage
    return None, None


def _accelerators() -> tuple[Accelerator, ...]:
    from . import ggml_devices  # deferred: it loads llama.cpp
    try:
        devs = ggml_devices.list_devices()
    except EdgespecError:  # llama-cpp-python not importable: CPU only
        return ()
    except (ImportError, AttributeError, OSError):  # a build without ggml's device API
        return ()
    out = []
    for d in devs:
        kind = str(d.get("type", "")).lower()
        if kind in ("gpu", "igpu", "accel"):
            out.append(Accelerator(name=str(d.get("name", "?")), kind=kind,
                                   free_bytes=int(d.get("free", 0)), total_bytes=int(d.get("total", 0)),
                                   description=str(d.get("description", ""))))
    return tuple(out)
