"""`make anchors`: build llama.cpp's own tools from the llama.cpp the engine links.

    python -m edgespec.lab.bench.anchors.build --cmake-args "<the Makefile's LLAMA_CMAKE_ARGS>"

The source is the vendored tree of the installed llama-cpp-python's sdist (fetched with
pip), so the anchors and the engine run the same kernels; the CMake flags are the ones the
Makefile gave llama-cpp-python. Only the tool targets are built (llama-server for the
serving benchmark, tools/bench_serve.py), linked statically
(the shared/static choice changes no kernel) so the binaries need nothing beside them.
Idempotent: a stamp next to the binaries records version, flags and tools; a second run with
the same ones does nothing, different flags (or version) rebuild from a clean build tree, and
a new tool with the same flags is built in the existing tree (minutes, not the hour a clean
build of every tool takes on a small CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from ....errors import EdgespecError
from .paths import TOOL_TARGETS, anchors_bin_dir, anchors_root, llama_cpp_python_version

STAMP = "BUILD.json"
# Build switches that keep the build to what the tools need; none touches a kernel.
FIXED_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF")


class AnchorBuildError(EdgespecError):
    """The anchor tools could not be built."""


def _stamp(version: str, cmake_args: tuple[str, ...]) -> dict:
    return {"llama_cpp_python": version, "cmake_args": list(cmake_args), "targets": list(TOOL_TARGETS)}


def is_current(bin_dir: Path, version: str, cmake_args: tuple[str, ...]) -> bool:
    """True when every tool is there and was built from this version with these flags."""
    try:
        recorded = json.loads((bin_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    recorded.pop("build_seconds", None)
    return recorded == _stamp(version, cmake_args) and all(
        os.access(bin_dir / t, os.X_OK) for t in TOOL_TARGETS)


def _same_flags(bin_dir: Path, version: str, cmake_args: tuple[str, ...]) -> bool:
    """Whether the last build into ``bin_dir`` used this version and these flags (its tree
    can then build more tools without starting over)."""
    try:
        recorded = json.loads((bin_dir / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded.get("llama_cpp_python") == version \
        and recorded.get("cmake_args") == list(cmake_args)


def _run(cmd: list[str], **kw) -> None:
    print("+", shlex.join(cmd), flush=True)
    try:
        subprocess.run(cmd, check=True, **kw)
    except FileNotFoundError:
        raise AnchorBuildError(f"{cmd[0]} not found: install it (cmake and a C++ compiler are "
                               "needed to build the anchors)") from None
    except subprocess.CalledProcessError as exc:
        raise AnchorBuildError(f"`{shlex.join(cmd)}` failed (exit {exc.returncode}); "
                               "see the output above") from None


def fetch_sdist(version: str, dest: Path) -> Path:
    """The llama-cpp-python sdist, downloaded once with pip (wheels are refused)."""
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not found:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
              f"llama-cpp-python=={version}", "-d", str(dest)])
        found = sorted(dest.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not found:
        raise AnchorBuildError(f"pip did not leave llama_cpp_python-{version}.tar.gz in {dest}")
    return found[0]


def extract_vendored(sdist: Path, dest: Path) -> Path:
    """Unpack only vendor/llama.cpp of the sdist into ``dest`` (replacing what was there)."""
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        prefix = f"{top}/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise AnchorBuildError(f"{sdist.name} has no vendor/llama.cpp")
        for m in members:
            m.name = m.name[len(prefix):]
        members = [m for m in members if m.name]
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        tar.extractall(dest, members=members, filter="data")
    return dest


def build(cmake_args: tuple[str, ...], *, bin_dir: Path | None = None, version: str | None = None,
          jobs: int | None = None, force: bool = False) -> Path:
    version = version or llama_cpp_python_version()
    if version == "unknown":
        raise AnchorBuildError("llama-cpp-python is not installed: run `make install` first")
    bin_dir = bin_dir or anchors_bin_dir()
    if not force and is_current(bin_dir, version, cmake_args):
        print(f"anchors up to date in {bin_dir}")
        return bin_dir
    root = anchors_root(version)
    t0 = time.monotonic()
    src, build_dir = root / "llama.cpp", root / "build"
    if force or not (_same_flags(bin_dir, version, cmake_args) and src.is_dir()
                     and (build_dir / "CMakeCache.txt").is_file()):
        src = extract_vendored(fetch_sdist(version, root / "sdist"), src)
        if build_dir.exists():  # flags may have changed; a stale CMake cache would keep old ones
            shutil.rmtree(build_dir)
    _run(["cmake", "-S", str(src), "-B", str(build_dir), *FIXED_ARGS, *cmake_args])
    _run(["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs or os.cpu_count() or 1),
          "--target", *TOOL_TARGETS])
    bin_dir.mkdir(parents=True, exist_ok=True)
    for t in TOOL_TARGETS:
        built = build_dir / "bin" / t
        if not built.exists():
            raise AnchorBuildError(f"the build did not produce {built}")
        shutil.copy2(built, bin_dir / t)
    seconds = time.monotonic() - t0
    (bin_dir / STAMP).write_text(json.dumps({**_stamp(version, cmake_args),
                                             "build_seconds": round(seconds, 1)}, indent=1) + "\n")
    print(f"built {', '.join(TOOL_TARGETS)} (llama-cpp-python {version}) in {bin_dir} "
          f"in {seconds / 60:.1f} min")
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.lab.bench.anchors.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cmake-args", default="", help="the flags llama-cpp-python was built with")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = ap.parse_args(argv)
    try:
        build(tuple(shlex.split(args.cmake_args)), jobs=args.jobs, force=args.force)
    except EdgespecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
