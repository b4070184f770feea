"""What the installed llama.cpp was built with, against what this machine offers.

Pure functions over plain facts (llama.cpp's ``llama_print_system_info`` line, the CPU's
``/proc/cpuinfo`` flags, the accelerators the host shows), so ``edgespec doctor`` and the
release identity can be tested on any machine:

- :func:`cmake_args` is the CMake flag set ``make install`` builds llama-cpp-python with:
  exactly the x86 extensions the CPU reports, never AMX. A native build is what llama.cpp
  would pick, but some VMs report AMX and fault on it, and a fixed list of extensions faults
  on CPUs that lack one (AVX-VNNI is Intel-only; AMD EPYC has AVX512-VNNI but not AVX-VNNI).
- :func:`diagnose` compares a build with the machine: an extension compiled in that the
  CPU lacks (an illegal-instruction crash), one the CPU has that the build lacks (slower
  matmuls), AMX compiled in, an accelerator the build cannot use, no RPC backend; each
  finding carries the exact command that rebuilds llama-cpp-python for this machine.

Run as a script (``python edgespec/runtime/llama_build.py``) it prints :func:`cmake_args` for
this machine: the Makefile calls it before any virtualenv exists (standard library only).
"""
from __future__ import annotations

import platform
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

#: (/proc/cpuinfo flag, GGML CMake option, llama_print_system_info key)
ISA = (
    ("avx", "AVX", "AVX"), ("avx2", "AVX2", "AVX2"), ("fma", "FMA", "FMA"),
    ("f16c", "F16C", "F16C"), ("bmi2", "BMI2", "BMI2"), ("avx512f", "AVX512", "AVX512"),
    ("avx512vbmi", "AVX512_VBMI", "AVX512_VBMI"), ("avx512_vnni", "AVX512_VNNI", "AVX512_VNNI"),
    ("avx512_bf16", "AVX512_BF16", "AVX512_BF16"), ("avx_vnni", "AVX_VNNI", "AVX_VNNI"),
)
AMX = ("AMX_TILE", "AMX_INT8", "AMX_BF16")
#: llama_print_system_info sections that are accelerator backends, by the CMake option
GPU_BACKENDS = {"CUDA": "GGML_CUDA", "METAL": "GGML_METAL", "VULKAN": "GGML_VULKAN",
                "ROCM": "GGML_HIP", "HIP": "GGML_HIP", "SYCL": "GGML_SYCL"}


def cmake_args(cpu_flags: set[str] | None) -> str:
    """The GGML CMake flags for a CPU with ``cpu_flags``; "" where there are none to read
    (macOS, Arm: llama.cpp detects the CPU itself)."""
    if not cpu_flags:
        return ""
    out = ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{a}=OFF" for a in AMX]
    out += [f"-DGGML_{opt}={'ON' if flag in cpu_flags else 'OFF'}" for flag, opt, _ in ISA]
    return " ".join(out)


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """``"CPU : AVX = 1 | AVX2 = 1 | ... | CUDA : ARCHS = 890 | ..."`` -> {section: {key: value}}.

    A key that follows no section heading lands under ``""``."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        head, sep, rest = part.partition(" : ")
        if sep:  # "CPU : SSE3 = 1": a new section, then its first pair
            current = head.strip().upper()
            part = rest
        key, eq, value = part.partition("=")
        sections.setdefault(current, {})
        if eq:
            sections[current][key.strip().upper()] = value.strip()
    return sections


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine() or "unknown CPU", flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if not model and key in ("model name", "hardware", "cpu model"):
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model or platform.machine() or "unknown CPU", flags


@dataclass(frozen=True)
class Host:
    """What the machine offers, read without llama.cpp."""

    cpu: str
    cpu_flags: frozenset[str]
    accelerators: tuple[str, ...] = ()  # "CUDA", "METAL", "ROCM" seen on the host

    @staticmethod
    def local() -> "Host":
        cpu, flags = _cpuinfo()
        return Host(cpu=cpu, cpu_flags=frozenset(flags), accelerators=host_accelerators())


@dataclass(frozen=True)
class Build:
    """What the installed llama.cpp was built with (``edgespec.runtime.backend.build_facts``)."""

    llama_cpp_python: str
    system_info: str
    rpc: bool
    gpu_offload: bool
    devices: tuple[str, ...] = ()  # ggml backend device names ("CPU", "CUDA0", ...)


@dataclass(frozen=True)
class Finding:
    level: str  # "ok", "warn" (slower or a feature missing), "error" (will crash or fail)
    topic: str
    detail: str


@dataclass
class Diagnosis:
    findings: list[Finding] = field(default_factory=list)
    rebuild: str | None = None  # the command that builds llama-cpp-python for this machine

    @property
    def worst(self) -> str:
        levels = [f.level for f in self.findings]
        return "error" if "error" in levels else "warn" if "warn" in levels else "ok"

    def to_json(self) -> dict:
        return {"status": self.worst, "rebuild": self.rebuild,
                "findings": [f.__dict__ for f in self.findings]}


def host_accelerators() -> tuple[str, ...]:
    """Accelerators the host shows whatever llama.cpp was built with."""
    seen = []
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia/version").exists():
        seen.append("CUDA")
    if Path("/dev/kfd").exists():
        seen.append("ROCM")
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        seen.append("METAL")
    return tuple(seen)


def diagnose(build: Build, host: Host) -> Diagnosis:
    info = parse_system_info(build.system_info)
    cpu = info.get("CPU", {})
    d = Diagnosis()
    needs_rebuild = False
    if not cpu:
        d.findings.append(Finding("warn", "cpu", "llama.cpp reported no CPU features "
                                  f"({build.system_info!r}); cannot compare them with the CPU"))
    elif host.cpu_flags:
        built = {opt for flag, opt, key in ISA if cpu.get(key) == "1"}
        has = {opt for flag, opt, _ in ISA if flag in host.cpu_flags}
        for opt in sorted(built - has):
            needs_rebuild = True
            d.findings.append(Finding("error", "cpu", f"built with {opt}, which this CPU "
                                      f"({host.cpu}) lacks: llama.cpp will die of an illegal "
                                      "instruction"))
        for opt in sorted(has - built):
            needs_rebuild = True
            d.findings.append(Finding("warn", "cpu", f"this CPU has {opt} but the build does "
                                      "not use it: matmuls run slower than they could"))
        if built == has:
            d.findings.append(Finding("ok", "cpu", "the build's x86 extensions are exactly the "
                                      f"CPU's ({', '.join(sorted(has)) or 'none'})"))
        amx = [a for a in AMX if cpu.get(a) == "1"]
        if amx:
            needs_rebuild = True
            d.findings.append(Finding("error" if not any(f.startswith("amx") for f in host.cpu_flags)
                                      else "warn", "amx", f"built with {', '.join(amx)}: some "
                                      "VMs report AMX and fault on it; edgespec builds without"))
    built_gpus = [name for name in info if name in GPU_BACKENDS]
    for acc in host.accelerators:
        if acc not in built_gpus and not any(dev.upper().startswith(acc) for dev in build.devices):
            needs_rebuild = True
            d.findings.append(Finding("warn", "accelerator", f"this machine has {acc} but "
                                      "llama.cpp was built without it: everything runs on the CPU"))
    for name in built_gpus:
        d.findings.append(Finding("ok", "accelerator", f"built with {name}"))
    if not build.rpc:
        needs_rebuild = True
        d.findings.append(Finding("warn", "rpc", "built without the RPC backend: `--rpc` "
                                  "(splitting a target across machines) is unavailable"))
    else:
        d.findings.append(Finding("ok", "rpc", "the RPC backend is built in"))
    if needs_rebuild:
        d.rebuild = rebuild_command(build.llama_cpp_python, host)
    return d


def rebuild_command(version: str, host: Host) -> str:
    args = cmake_args(set(host.cpu_flags))
    extra = [f"-D{GPU_BACKENDS[a]}=ON" for a in host.accelerators if a in GPU_BACKENDS]
    flags = " ".join(x for x in (args, *extra, "-DGGML_RPC=ON") if x)
    return (f'CMAKE_ARGS="{flags}" pip install --force-reinstall --no-deps --no-cache-dir '
            f"--no-binary llama-cpp-python llama-cpp-python=={version}")


if __name__ == "__main__":  # the Makefile: the default CMake flags for this CPU
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    print(cmake_args(set(m.group(1).split()) if m else None))
