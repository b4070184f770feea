#!/usr/bin/env python3
"""GPU check (issue #30, part 6): edgespec on a Linux machine with an NVIDIA GPU, one report.

Builds llama.cpp with CUDA, measures the verify-cost curve and the exact cap with every layer
on the GPU, and benchmarks the proposers against the plain path. It needs only the standard
library to start, so it also runs on a bare, offline machine: `pack` (on a machine with
network) writes a bundle of what such a machine may lack (the llama-cpp-python sdist, pinned
wheels, optionally the models cut into parts for transfers with a size limit).

    python3 tools/device_check.py pack [--bundle DIR]        # with network, once
    python3 tools/device_check.py run [--bundle DIR] [--out DIR] [--json PATH]
    python3 tools/device_check.py run --dry-run              # no GPU: SmolLM2-135M, CPU backend
                                                             # (what tests/tools/ runs)

Stages, in order (`--stages` picks some; a later invocation with the same --work adds its
stages to the report kept there, --fresh starts over, so a per-command time limit can be
met by splitting the stages). Each has a time budget (--budget STAGE=SECONDS; all within
--deadline), and its child processes are killed with their process group when it runs out:

    env        nvidia-smi, nvcc, cmake, ninja, compiler, Python, CPUs, memory, disk
    deps       the bundle's wheels into WORK/site (offline), edgespec's imports checked,
               its native library built in place where it is missing
    build      llama.cpp from the bundle's sdist with -DGGML_CUDA=on -DGGML_RPC=ON for this
               GPU's architecture, ONE compile for both the engine's shared libraries and the
               llama.cpp anchors (llama-completion, llama-lookup, llama-speculative-simple);
               llama-cpp-python's Python package over those libraries. Reused when built
               with the same flags. --dry-run compiles nothing: it configures the bundle's
               sdist if there is one and uses the installed llama-cpp-python.
    models     the GGUF files (--models-dir, $EDGESPEC_HOME/models, parts from the bundle
               joined and checked against models.toml's sha256); what is missing is named
    doctor     `edgespec doctor --json`: the build against the machine
    calibrate  the verify-cost curve and the exactness probe (the largest pass whose logits
               are bitwise single-token decoding's), measured anew with every layer on the
               GPU; then `edgespec plan --json` on this machine
    bench      `edgespec bench`: plain, the draft pair (qwen-1.5b + qwen-0.5b), n-grams,
               suffix trees, and llama.cpp's llama-completion / llama-speculative-simple
               anchors when built
    proposers  the newer proposers that are registered (self, lookahead) against plain, and
               mtp on the tests' tiny GGUF with a NextN layer (plumbing, not speed)
    trees      draft trees (--tree-width 4) of the free proposers against plain

Results are printed, one line per stage, and the report is rewritten after every stage (and
before each, marked running), so a timeout or a killed command still leaves what was
measured: --json (default OUT/report.json), and in --out report.md, log.txt (each stage's
output, its tail) and one bench-<stage>.json per bench stage.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".gpucheck"            # ignored by git: the defaults of the folders below
BUNDLE = STATE / "bundle"             # what `pack` writes for an offline machine: sdist, wheels
PARTS = STATE / "parts"               # models cut into parts by `pack`, moved to BUNDLE/parts
WORK = STATE / "work"                 # builds and state, kept between invocations

LLAMA_CPP_VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{LLAMA_CPP_VERSION}-slim.tar.gz"
PART_BYTES = 48 * 2**20  # `pack --part-mib`: small enough for a transfer capped at 64 MiB

#: edgespec's and llama-cpp-python's runtime dependencies that a CUDA image with numpy, click,
#: jinja2, psutil and huggingface_hub may lack, pinned to what this project runs with
WHEELS = ("platformdirs==4.14.9", "gguf==0.19.0", "jsonschema==4.26.0",
          "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==2026.9.1",
          "diskcache==5.6.3")
#: what `import edgespec` and the bench need at run time (import names)
IMPORTS = ("numpy", "click", "platformdirs", "psutil", "gguf", "jinja2", "jsonschema",
           "huggingface_hub", "diskcache", "typing_extensions", "matplotlib")

STAGES = ("env", "deps", "build", "models", "doctor", "calibrate", "bench", "proposers", "trees")
#: seconds per stage on a 16-core machine (--budget to change); --dry-run's suit the tiny model
BUDGETS = {"env": 30, "deps": 90, "build": 480, "models": 90, "doctor": 60, "calibrate": 120,
           "bench": 210, "proposers": 150, "trees": 120}
DRY_BUDGETS = {"env": 30, "deps": 120, "build": 120, "models": 30, "doctor": 60,
               "calibrate": 120, "bench": 240, "proposers": 240, "trees": 180}

#: llama.cpp targets of the one CUDA compile: the engine's libraries and the anchors
LIB_TARGETS = ("llama", "ggml", "mtmd")
ANCHOR_TARGETS = ("llama-completion", "llama-lookup", "llama-speculative-simple")
#: what the slim sdist leaves out: never read by a build without tests, server or web UI
#: (the vocabulary GGUFs alone are 60 MB, the docs' op tables 38 MB, a git checkout 39 MB)
SLIM_DROP = (r"(^|/)\.git(/|$)", r"^vendor/llama\.cpp/docs/", r"^vendor/llama\.cpp/models/.*\.gguf$",
             r"^vendor/llama\.cpp/benches/", r"^vendor/llama\.cpp/tools/ui/",
             r"^vendor/llama\.cpp/media/", r"^vendor/llama\.cpp/tests/",
             r"^vendor/llama\.cpp/gguf-py/", r"^vendor/llama\.cpp/examples/llama\.(android|swiftui)/",
             r"^examples/", r"^docs/", r"^tests/")

#: the pair the issue measures, else the small model alone (--target/--draft override)
GPU_MODELS = (("qwen-1.5b", "qwen-0.5b"), ("smollm2-135m", None))
DRY_TARGET = "smollm2-135m"


# --- small helpers -----------------------------------------------------------------
def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def registry_models() -> dict:
    """models.toml's pins (size, sha256) by name, read without importing edgespec."""
    import tomllib
    data = tomllib.loads((ROOT / "edgespec" / "registry" / "models.toml").read_text())
    return {name: {"size": int(m["size"]), "sha256": m["sha256"], "description": m.get("description", "")}
            for name, m in data.get("models", {}).items()}


class StageFailed(Exception):
    """A stage's own verdict: the message is its summary line."""


class Skip(Exception):
    """The stage cannot run here; the message says why and what it needs."""


class Proc:
    """One child process, killed with its process group at its deadline; output in a log."""

    def __init__(self, rc: int | None, output: str, seconds: float, timed_out: bool) -> None:
        self.rc, self.output, self.seconds, self.timed_out = rc, output, seconds, timed_out

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out


# --- the check -----------------------------------------------------------------------
class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry = args.dry_run
        self.work = Path(args.work).resolve()
        self.bundle = Path(args.bundle).resolve()
        self.out = Path(args.out or self.work / "out").resolve()
        self.json_path = Path(args.json).resolve() if args.json else self.out / "report.json"
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.deadline
        self.budgets = dict(DRY_BUDGETS if self.dry else BUDGETS)
        for item in args.budget:
            name, _, sec = item.partition("=")
            if name not in self.budgets or not sec.replace(".", "", 1).isdigit():
                raise SystemExit(f"--budget takes STAGE=SECONDS with STAGE one of {', '.join(STAGES)} "
                                 f"(got {item!r})")
            self.budgets[name] = float(sec)
        self.site = self.work / "site"
        self.home = self.work / "home"
        self.build_dir = self.work / "build"
        self.logs = self.work / "logs"
        for d in (self.work, self.out, self.logs, self.home / "models", self.json_path.parent):
            d.mkdir(parents=True, exist_ok=True)
        self.report = self._load_report()
        self.stage_end = self.deadline

    # -- the report ---------------------------------------------------------------------
    def _load_report(self) -> dict:
        path = self.work / "report.json"
        mode = "dry-run" if self.dry else "gpu"
        if not self.args.fresh and path.is_file():
            try:
                rep = json.loads(path.read_text())
                if rep.get("schema") == 1 and rep.get("mode") == mode:
                    rep.setdefault("invocations", []).append(self._invocation())
                    return rep
            except ValueError:
                pass
        return {"schema": 1, "tool": "tools/device_check.py", "mode": mode, "started": now_iso(),
                "invocations": [self._invocation()], "stages": {}}

    def _invocation(self) -> dict:
        return {"at": now_iso(), "argv": sys.argv[1:], "deadline_s": self.args.deadline}

    def write(self) -> None:
        self.report["updated"] = now_iso()
        text = json.dumps(self.report, indent=1, sort_keys=False, default=str)
        for path in (self.work / "report.json", self.json_path):
            path.write_text(text + "\n")
        (self.out / "report.md").write_text(render_markdown(self.report))
        with open(self.out / "log.txt", "w", encoding="utf-8") as f:
            for name in STAGES:
                log = self.logs / f"{name}.log"
                if log.is_file():
                    body = log.read_text(encoding="utf-8", errors="replace")
                    f.write(f"===== {name} ({len(body)} chars, the last 300 lines) =====\n")
                    f.write(tail(body, 300) + "\n\n")

    # -- child processes -------------------------------------------------------------------
    def env(self) -> dict:
        """The environment every edgespec child runs in: its own EDGESPEC_HOME (a dry run
        must not overwrite the machine's calibration cache), the bundle's wheels first."""
        env = dict(os.environ)
        paths = [str(ROOT)]
        if self.site.is_dir():
            paths.insert(0, str(self.site))
        env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
        env["EDGESPEC_HOME"] = str(self.home)
        env["PYTHONUNBUFFERED"] = "1"
        env["MPLBACKEND"] = "Agg"
        anchors = self.build_dir / "bin"
        if anchors.is_dir():
            env["EDGESPEC_ANCHORS"] = str(anchors)
        return env

    def run(self, stage: str, cmd: list[str], *, cwd: Path | None = None, env: dict | None = None,
            limit: float | None = None) -> Proc:
        """Run ``cmd`` with its output appended to the stage's log, until the stage's end."""
        left = self.stage_end - time.monotonic()
        if limit is not None:
            left = min(left, limit)
        if left < 1:
            return Proc(None, "no time left in the stage's budget", 0.0, True)
        log = self.logs / f"{stage}.log"
        start = log.stat().st_size if log.is_file() else 0
        t0 = time.monotonic()
        timed_out = False
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"\n$ {shlex.join(cmd)}\n")
            f.flush()
            try:
                p = subprocess.Popen(cmd, cwd=cwd or ROOT, env=env or self.env(), stdout=f,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
            except FileNotFoundError:
                f.write(f"{cmd[0]}: not found\n")
                return Proc(127, f"{cmd[0]}: not found", 0.0, False)
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                timed_out, rc = True, None
                _kill_group(p)
                f.write(f"\n[gpu-check] killed after {left:.0f} s: the stage's budget ran out\n")
        with open(log, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            out = f.read()
        return Proc(rc, out, time.monotonic() - t0, timed_out)

    def python(self, stage: str, code: str, **kw) -> Proc:
        return self.run(stage, [sys.executable, "-c", code], **kw)

    def edgespec(self, stage: str, *argv: str, **kw) -> Proc:
        code = "import sys; sys.argv[0] = 'edgespec'; from edgespec.cli import main; main()"
        return self.run(stage, [sys.executable, "-c", code, *argv], **kw)

    # -- stages ----------------------------------------------------------------------------
    def stage(self, name: str) -> None:
        rec = {"status": "running", "budget_s": self.budgets[name], "started": now_iso()}
        self.report["stages"][name] = rec
        left = self.deadline - time.monotonic() - 5
        if left < 10:
            rec.update(status="skipped", seconds=0.0,
                       summary=f"no time left within --deadline {self.args.deadline:.0f} s")
            self.write()
            return
        budget = min(self.budgets[name], left)
        rec["budget_s"] = round(budget, 1)
        self.stage_end = time.monotonic() + budget
        (self.logs / f"{name}.log").write_text(f"[gpu-check] {name} at {now_iso()}\n")
        self.write()
        t0 = time.monotonic()
        details: dict = {}
        try:
            summary = getattr(self, f"stage_{name}")(details)
            status = "ok"
        except Skip as e:
            status, summary = "skipped", str(e)
        except StageFailed as e:
            status, summary = "failed", str(e)
        except Exception as e:  # a bug here must not cost the later stages
            status, summary = "failed", f"{type(e).__name__}: {e}"
            details["traceback"] = traceback.format_exc()
        seconds = time.monotonic() - t0
        if status != "ok" and time.monotonic() >= self.stage_end - 0.5:
            status = "timeout"
            summary = f"stopped at its {budget:.0f} s budget: {summary}"
        rec.update(status=status, seconds=round(seconds, 1), summary=summary, details=details)
        self.write()
        print(f"[gpu-check] {name}: {status} in {seconds:.1f} s: {summary}", flush=True)

    def stage_env(self, d: dict) -> str:
        d["python"] = {"version": platform.python_version(), "executable": sys.executable}
        d["machine"] = {"cpus": os.cpu_count(), "arch": platform.machine(), "kernel": platform.release(),
                        "memory": _meminfo(), "disk_free": mib(shutil.disk_usage(self.work).free)}
        gpu = self.run("env", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                               "--format=csv,noheader"], limit=20)
        d["gpus"] = ([dict(zip(("name", "memory", "driver", "compute_cap"),
                               (x.strip() for x in line.split(","))))
                      for line in gpu.output.splitlines()[1:] if line.count(",") >= 3] if gpu.ok else [])
        for tool, argv in (("nvcc", ["nvcc", "--version"]), ("cmake", ["cmake", "--version"]),
                           ("ninja", ["ninja", "--version"]), ("cc", ["cc", "--version"])):
            p = self.run("env", argv, limit=20)
            lines = [x for x in p.output.splitlines()[1:] if x.strip()]
            d[tool] = (lines[-1] if tool == "nvcc" else lines[0]) if p.ok and lines else None
        mods = self.python("env", "import importlib.metadata as m, json, sys\n"
                                  f"names = {['llama-cpp-python', 'scikit-build-core', 'numpy', 'matplotlib']!r}\n"
                                  "out = {}\n"
                                  "for n in names:\n"
                                  "    try: out[n] = m.version(n)\n"
                                  "    except m.PackageNotFoundError: out[n] = None\n"
                                  "print('PKGS', json.dumps(out))", limit=30)
        d["packages"] = _tagged_json(mods.output, "PKGS") or {}
        if not d["gpus"]:
            if self.dry:
                return f"no GPU (dry run: CPU backend); {d['machine']['cpus']} CPUs, Python {d['python']['version']}"
            raise StageFailed("nvidia-smi sees no GPU: the CUDA stages will fail here")
        g = d["gpus"][0]
        return (f"{g['name']} ({g['memory']}, driver {g['driver']}, compute {g['compute_cap']}); "
                f"nvcc {d['nvcc'] or 'missing'}; {d['machine']['cpus']} CPUs, Python {d['python']['version']}")

    def stage_deps(self, d: dict) -> str:
        wheels = sorted((self.bundle / "wheels").glob("*.whl"))
        d["bundled_wheels"] = [w.name for w in wheels]
        stamp = self.site / ".wheels.json"
        if wheels and not (stamp.is_file() and json.loads(stamp.read_text()) == d["bundled_wheels"]):
            p = self.run("deps", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                  "--no-compile", "--no-cache-dir", "--upgrade", "--target",
                                  str(self.site), *map(str, wheels)])
            if not p.ok:
                raise StageFailed(f"pip could not install the bundle's wheels: {tail(p.output, 3)}")
            stamp.write_text(json.dumps(d["bundled_wheels"]))
        check = self.python("deps", "import importlib, json\nmissing = []\n"
                                    f"for n in {list(IMPORTS)!r}:\n"
                                    "    try: importlib.import_module(n)\n"
                                    "    except Exception as e: missing.append(f'{n} ({e})')\n"
                                    "print('MISSING', json.dumps(missing))", limit=60)
        missing = _tagged_json(check.output, "MISSING")
        d["missing_imports"] = missing
        if missing is None or missing:
            raise StageFailed(f"edgespec's dependencies do not import: {missing or tail(check.output, 3)}; "
                              "`python3 tools/device_check.py pack` bundles them as wheels")
        native = self.python("deps", "import edgespec._native", limit=30)
        d["native"] = "present"
        if not native.ok:
            p = self.run("deps", [sys.executable, "setup.py", "-q", "build_ext", "--inplace"])
            d["native"] = "built" if p.ok else f"build failed: {tail(p.output, 3)}"
            if not p.ok:
                raise StageFailed("edgespec's native library (n-grams, suffix trees) did not build: "
                                  "is Python.h there?")
        return (f"{len(wheels)} bundled wheel(s) installed, " if wheels else "no wheels bundled, ") + \
            f"{len(IMPORTS)} imports ok, native library {d['native']}"

    def cmake_args(self, gpu: bool) -> list[str]:
        args = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_RPC=ON",
                "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON",
                "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]
        if gpu:
            # the GPU's compute capability as nvidia-smi reported it, else CMake's own probe
            arch = self.args.cuda_arch or _cuda_arch(self.report) or "native"
            args += ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
        if shutil.which("ninja"):
            args = ["-G", "Ninja", *args]
        return args

    def stage_build(self, d: dict) -> str:
        sdist = Path(self.args.sdist) if self.args.sdist else self.bundle / SDIST
        gpu = not self.dry
        flags = self.cmake_args(gpu)
        d["cmake_args"] = flags
        d["sdist"] = str(sdist) if sdist.is_file() else None
        if self.dry:
            return self._dry_build(sdist, flags, d)
        stamp = self.build_dir / "EDGESPEC_BUILD.json"
        want = {"version": LLAMA_CPP_VERSION, "cmake_args": flags}
        libs = self.site / "llama_cpp" / "lib"
        if stamp.is_file() and json.loads(stamp.read_text()).get("key") == want and any(libs.glob("libllama*")):
            d["reused"] = True
            return self._verify_llama(d, "reused the build made with the same flags")
        if not sdist.is_file():
            raise StageFailed(f"no llama-cpp-python sdist at {sdist}: `python3 tools/device_check.py "
                              "pack` writes one (or pass --sdist)")
        src = self.work / "src"
        t0 = time.monotonic()
        if src.exists():
            shutil.rmtree(src)
        _extract(sdist, src)
        if self.build_dir.exists():  # other flags: a stale CMake cache would keep its old ones
            shutil.rmtree(self.build_dir)
        d["extract_s"] = round(time.monotonic() - t0, 1)
        p = self.run("build", ["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(self.build_dir), *flags])
        d["configure_s"] = round(p.seconds, 1)
        if not p.ok:
            raise StageFailed(f"cmake configure failed: {tail(p.output, 4)}")
        jobs = str(os.cpu_count() or 4)
        p = self.run("build", ["cmake", "--build", str(self.build_dir), "--config", "Release", "-j", jobs,
                               "--target", *LIB_TARGETS, *ANCHOR_TARGETS])
        d["compile_s"] = round(p.seconds, 1)
        if not p.ok:
            raise StageFailed(f"the CUDA compile failed or ran out of time: {tail(p.output, 4)}")
        # llama-cpp-python's Python package only: its CMake builds nothing with LLAMA_BUILD off;
        # the libraries are the ones just compiled, so engine and anchors run the same kernels
        env = self.env()
        env["CMAKE_ARGS"] = "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
        p = self.run("build", [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                               "--no-build-isolation", "--no-compile", "--no-cache-dir", "--upgrade",
                               "--target", str(self.site), str(src)], env=env)
        d["python_package_s"] = round(p.seconds, 1)
        if not p.ok:
            raise StageFailed(f"llama-cpp-python's Python package did not install: {tail(p.output, 4)}")
        libs.mkdir(parents=True, exist_ok=True)
        copied = []
        for so in sorted((self.build_dir / "bin").glob("lib*.so*")):
            shutil.copy2(so, libs / so.name, follow_symlinks=True)
            copied.append(so.name)
        d["libraries"] = copied
        stamp.write_text(json.dumps({"key": want, "built_at": now_iso()}))
        return self._verify_llama(d, f"compiled in {d['compile_s']:.0f} s (configure {d['configure_s']:.0f} s)")

    def _dry_build(self, sdist: Path, flags: list[str], d: dict) -> str:
        done = []
        if sdist.is_file():
            src = self.work / "src"
            if not src.is_dir():
                _extract(sdist, src)
            p = self.run("build", ["cmake", "-S", str(src / "vendor" / "llama.cpp"),
                                   "-B", str(self.work / "build-dry"), *flags], limit=90)
            d["configure_s"] = round(p.seconds, 1)
            if not p.ok:
                raise StageFailed(f"cmake could not configure the bundle's sdist: {tail(p.output, 4)}")
            done.append("configured the bundle's sdist (CPU flags)")
        else:
            done.append("no sdist in the bundle to configure")
        return self._verify_llama(d, "dry run compiles nothing: " + "; ".join(done))

    def _verify_llama(self, d: dict, what: str) -> str:
        # the devices ggml registered, as edgespec's doctor reads them (llama.cpp's own
        # "supports GPU offload" is also true for a CPU build with the RPC backend)
        p = self.python("build", "import json, llama_cpp as l\nfrom edgespec.runtime import backend\n"
                                 "f = backend.build_facts()\n"
                                 "print('LLAMA', json.dumps({'version': f.llama_cpp_python, "
                                 "'devices': list(f.devices), 'rpc': f.rpc, "
                                 "'system_info': f.system_info, 'path': l.__file__}))", limit=60)
        info = _tagged_json(p.output, "LLAMA")
        d["llama_cpp"] = info
        if info is None:
            raise StageFailed(f"llama_cpp does not import: {tail(p.output, 4)}")
        anchors = [t for t in ANCHOR_TARGETS if os.access(self.build_dir / "bin" / t, os.X_OK)]
        d["anchors"] = anchors
        gpus = [x for x in info["devices"] if x != "CPU"]
        if not self.dry and not gpus:
            raise StageFailed(f"llama-cpp-python {info['version']} registered no GPU device "
                              f"({', '.join(info['devices'])}): {what}")
        return (f"{what}; llama-cpp-python {info['version']} on {', '.join(info['devices'])} "
                f"(RPC {info['rpc']}); anchors: {', '.join(anchors) or 'none'}")

    def stage_models(self, d: dict) -> str:
        pins = registry_models()
        stored = _store_parts(self.bundle / "parts", self.work / "parts")
        d["parts_stored"] = stored
        joined = _join_parts(self.work / "parts", self.home / "models", pins)
        d["joined"] = joined
        for src in self._model_dirs():
            for f in src.glob("*.gguf"):
                dest = self.home / "models" / f.name
                if not dest.exists():
                    dest.symlink_to(f.resolve())
                    stamp = f.with_name(f.name + ".verified")
                    if stamp.is_file():
                        (self.home / "models" / stamp.name).symlink_to(stamp.resolve())
        have = {f.stem: f for f in (self.home / "models").glob("*.gguf")}
        d["found"] = {n: {"size": mib(p.stat().st_size), "path": str(p)} for n, p in sorted(have.items())}
        pairs = ([(self.args.target, self.args.draft)] if self.args.target else
                 [(DRY_TARGET, DRY_TARGET)] if self.dry else list(GPU_MODELS))
        wanted = {n for pair in pairs for n in pair if n}
        d["missing"] = {n: {"size": mib(pins[n]["size"]) if n in pins else "?",
                            "parts": -(-pins[n]["size"] // PART_BYTES) if n in pins else None}
                        for n in sorted(wanted - set(have))}
        for target, draft in pairs:
            if target in have:
                chosen = {"target": target, "target_path": str(have[target]),
                          "draft": draft if draft in have else None,
                          "draft_path": str(have[draft]) if draft in have else None}
                self.report["models"] = chosen
                d["chosen"] = chosen
                lacking = "" if not d["missing"] else "; missing: " + ", ".join(
                    f"{n} ({m['size']})" for n, m in d["missing"].items())
                return f"target {target}, draft {chosen['draft'] or 'none'}{lacking}"
        self.report.pop("models", None)
        needs = ", ".join(f"{n} ({m['size']})" for n, m in d["missing"].items())
        raise StageFailed(f"no model to run: needs {needs} as NAME.gguf in --models-dir or "
                          f"$EDGESPEC_HOME/models, or its parts from `pack` in {self.bundle / 'parts'}")

    def _model_dirs(self) -> list[Path]:
        dirs = [Path(p).expanduser() for p in self.args.models_dir]
        env_home = os.environ.get("EDGESPEC_HOME")
        dirs.append(Path(env_home).expanduser() / "models" if env_home else Path.home() / ".cache" / "edgespec" / "models")
        return [p for p in dirs if p.is_dir() and p.resolve() != (self.home / "models").resolve()]

    def models(self) -> dict:
        m = self.report.get("models")
        if not m:
            raise Skip("no model: the models stage found none (see its summary)")
        return m

    def gpu_layers(self) -> int:
        return 0 if self.dry else 999  # every layer: llama.cpp clamps to the model's count

    def stage_doctor(self, d: dict) -> str:
        p = self.edgespec("doctor", "doctor", "--json", limit=60)
        doc = _last_json(p.output)
        d["doctor"] = doc
        if doc is None:
            raise StageFailed(f"edgespec doctor printed no JSON (exit {p.rc}): {tail(p.output, 4)}")
        worst = doc.get("status", "?")
        findings = "; ".join(f"{f.get('level')} {f.get('topic')}" for f in doc.get("findings", []))
        if p.rc not in (0, None) or worst == "error":
            raise StageFailed(f"the build would crash here ({findings}); rebuild: {doc.get('rebuild')}")
        return f"worst finding: {worst} ({findings})"

    def stage_calibrate(self, d: dict) -> str:
        m = self.models()
        repeats = "2" if self.dry else "5"
        p = self.run("calibrate", [sys.executable, str(Path(__file__).resolve()), "_calibrate",
                                   "--model", m["target_path"], "--gpu-layers", str(self.gpu_layers()),
                                   "--repeats", repeats])
        cal = _tagged_json(p.output, "CALIBRATION")
        if cal is None:
            raise StageFailed(f"the calibration did not finish (exit {p.rc}): {tail(p.output, 4)}")
        d["calibration"] = cal
        argv = ["plan", "--target", m["target_path"], "--gpu-layers", str(self.gpu_layers()), "--json"]
        if m.get("draft_path"):
            argv[3:3] = ["--draft", m["draft_path"]]
        plan = self.edgespec("calibrate", *argv)
        d["plan"] = _last_json(plan.output)
        pts = ", ".join(f"{n}:{c:.2f}" for n, c in cal["points"] if n in (2, 4, 8, 16))
        chosen = d["plan"]["runs"] if d["plan"] else f"plan failed (exit {plan.rc})"
        return (f"step {cal['step_seconds'] * 1000:.2f} ms; cost(n) {pts}; exact up to "
                f"{cal['exact_max_tokens']} tokens ({cal['exact_max_drafts']} drafts); plan runs {chosen}")

    def _bench(self, stage: str, d: dict, configs: list[str], *, tree_width: int = 0,
               anchors: list[str] = (), draft: bool = True, target: str | None = None,
               tag: str | None = None) -> str:
        m = self.models()
        tag = tag or stage  # names the matrix, the output folder and bench-<tag>.json
        toml = [f"target = {json.dumps(target or m['target_path'])}",
                f"max_new_tokens = {16 if self.dry else 128}", "temperature = 0.0",
                f"n_ctx = {1024 if self.dry else 4096}", f"warmup = {0 if self.dry else 1}",
                f"n_gpu_layers = {self.gpu_layers()}", f"tree_width = {tree_width}"]
        if draft and m.get("draft_path"):
            toml.append(f"draft = {json.dumps(m['draft_path'])}")
        cats = ["summarization"] if self.dry else ["summarization", "coding", "math_reasoning", "rag",
                                                    "extraction", "qa", "reasoning", "writing"]
        toml += ["", "[prompts]", f"spec_bench = {json.dumps(cats)}", "per_category = 1",
                 "max_turns = 1", f"humanevalfix = {0 if self.dry else 2}"]
        for c in configs:
            toml += ["", "[[config]]", f"proposer = {json.dumps(c)}"]
        for a in anchors:
            toml += ["", "[[anchor]]", f"name = {json.dumps(a)}"]
        mfile = self.work / f"matrix-{tag}.toml"
        mfile.write_text("\n".join(toml) + "\n")
        out = self.work / f"bench-{tag}"
        if out.exists():
            shutil.rmtree(out)
        d["matrix"] = "\n".join(toml)
        p = self.edgespec(stage, "bench", "--config", str(mfile), "--out", str(out))
        bench_json = out / "bench.json"
        if bench_json.is_file():
            shutil.copy2(bench_json, self.out / f"bench-{tag}.json")
            d["results"] = summarize_bench(json.loads(bench_json.read_text()))
        d["overall"] = [x.strip() for x in p.output.splitlines() if "×" in x]
        if not p.ok:
            what = "ran out of its budget" if p.timed_out else f"exited {p.rc}"
            raise StageFailed(f"edgespec bench {what}: {tail(p.output, 3)}"
                              + (" (partial results kept)" if d.get("results") else ""))
        res = d.get("results", {})
        return "; ".join(f"{k}: {v['decode_tok_s']:.1f} tok/s" + (f", accept {v['acceptance']:.0%}"
                                                                   if v.get("acceptance") is not None else "")
                         for k, v in res.items()) or "no results"

    def registered(self) -> list[str]:
        p = self.python("proposers", "from edgespec.proposers import REGISTRY; print('REG', "
                                     "__import__('json').dumps(sorted(REGISTRY)))", limit=60)
        return _tagged_json(p.output, "REG") or []

    def stage_bench(self, d: dict) -> str:
        m = self.models()
        configs = ["none", "ngram", "suffix"]
        if m.get("draft_path"):
            configs.insert(1, "draft")
        else:
            d["draft_pair"] = "skipped: no draft model (see the models stage)"
        built = self.report.get("stages", {}).get("build", {}).get("details", {}).get("anchors", [])
        anchors = [a for a in ("llama-completion", "llama-speculative-simple") if a in built
                   and (a != "llama-speculative-simple" or m.get("draft_path"))]
        d["anchors_skipped"] = [a for a in ("llama-completion", "llama-speculative-simple") if a not in anchors]
        return self._bench("bench", d, configs, anchors=anchors)

    def stage_proposers(self, d: dict) -> str:
        reg = self.registered()
        d["registered"] = reg
        # self and lookahead run on the target; mtp on the tiny GGUF with a NextN layer that
        # the tests build (tests/integration/mtp_model.py: plumbing, not speed); eagle3 needs
        # an EAGLE-3 draft, which no registry model is
        new = [n for n in ("self", "lookahead") if n in reg]
        d["not_run"] = {n: "not registered yet" for n in ("self", "lookahead", "mtp", "eagle3")
                        if n not in reg}
        if "eagle3" in reg:
            d["not_run"]["eagle3"] = "needs an EAGLE-3 draft; none is in the registry"
        if not new and "mtp" not in reg:
            raise Skip("none of self, lookahead, mtp is registered in this checkout")
        parts, failed = [], []
        for name, run in (("self/lookahead", lambda: self._bench("proposers", d, ["none", *new],
                                                                  draft=False) if new else ""),
                          ("mtp", lambda: self._mtp(d.setdefault("mtp", {})) if "mtp" in reg else "")):
            try:
                parts.append(run())
            except StageFailed as e:
                failed.append(f"{name}: {e}")
        if failed:
            raise StageFailed("; ".join(failed + [p for p in parts if p]))
        return "; ".join(p for p in parts if p)

    def _mtp(self, d: dict) -> str:
        """mtp against plain on the tests' tiny NextN GGUF, its tokenizer the target's."""
        path = self.work / "tiny-mtp.gguf"
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
                "from mtp_model import write_mtp_model; "
                "write_mtp_model(Path(sys.argv[2]), Path(sys.argv[3]))")
        p = self.run("proposers", [sys.executable, "-c", code, str(ROOT / "tests" / "integration"),
                                   str(path), self.models()["target_path"]], limit=120)
        if not p.ok or not path.is_file():
            raise StageFailed(f"the tiny MTP GGUF was not written (exit {p.rc}): {tail(p.output, 3)}")
        d["model"] = f"{path.name} ({mib(path.stat().st_size)}), tests/integration/mtp_model.py"
        return "mtp (tiny NextN GGUF, plumbing): " + self._bench(
            "proposers", d, ["none", "mtp"], draft=False, target=str(path), tag="proposers-mtp")

    def stage_trees(self, d: dict) -> str:
        return self._bench("trees", d, ["none", "suffix", "ngram"], tree_width=2 if self.dry else 4)


# --- pure helpers (tested directly) ---------------------------------------------------------
def _kill_group(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _meminfo() -> str:
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        return f"{kb / 2**20:.1f} GiB"
    except (OSError, AttributeError):
        return "?"


def _tagged_json(output: str, tag: str):
    for line in reversed(output.splitlines()):
        if line.startswith(tag + " "):
            try:
                return json.loads(line[len(tag) + 1:])
            except ValueError:
                return None
    return None


def _last_json(output: str):
    """The last top-level JSON object a command printed (edgespec's --json outputs)."""
    end = output.rfind("}")
    while end >= 0:
        start = output.rfind("\n{", 0, end)
        start = 0 if start < 0 and output.startswith("{") else start + 1 if start >= 0 else -1
        if start < 0:
            return None
        try:
            return json.loads(output[start:end + 1])
        except ValueError:
            end = output.rfind("}", 0, start)
    return None


def _cuda_arch(report: dict) -> str | None:
    gpus = report.get("stages", {}).get("env", {}).get("details", {}).get("gpus") or []
    cap = gpus[0].get("compute_cap", "") if gpus else ""
    return cap.replace(".", "") if re.fullmatch(r"\d+\.\d+", cap or "") else None


def _extract(sdist: Path, dest: Path) -> None:
    """Unpack the sdist's top folder's contents into ``dest``."""
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        top = members[0].name.split("/")[0]
        for mem in members:
            mem.name = mem.name[len(top) + 1:] if mem.name.startswith(top + "/") else ""
        tar.extractall(dest, members=[x for x in members if x.name], filter="data")


def slim_sdist(src: Path, dest: Path) -> tuple[int, int]:
    """Copy the sdist without SLIM_DROP's paths; returns (members kept, members dropped)."""
    drop = [re.compile(p) for p in SLIM_DROP]
    kept = dropped = 0
    with tarfile.open(src) as tin, tarfile.open(dest, "w:gz", compresslevel=9) as tout:
        for mem in tin:
            rel = mem.name.partition("/")[2]
            if rel and any(p.search(rel) for p in drop):
                dropped += 1
                continue
            tout.addfile(mem, tin.extractfile(mem) if mem.isfile() else None)
            kept += 1
    return kept, dropped


def split_model(path: Path, name: str, sha256: str, dest: Path, part_bytes: int = PART_BYTES) -> list[str]:
    """Cut a model into ``NAME.gguf.NNN-of-MMM.SHA16`` parts (the name says what it belongs to)."""
    size = path.stat().st_size
    count = -(-size // part_bytes)
    names = []
    dest.mkdir(parents=True, exist_ok=True)
    with open(path, "rb") as f:
        for i in range(count):
            part = dest / f"{name}.gguf.{i + 1:03d}-of-{count:03d}.{sha256[:16]}"
            if not (part.is_file() and part.stat().st_size == min(part_bytes, size - i * part_bytes)):
                f.seek(i * part_bytes)
                part.write_bytes(f.read(part_bytes))
            names.append(part.name)
    return names


_PART = re.compile(r"^(?P<name>.+)\.gguf\.(?P<i>\d{3})-of-(?P<n>\d{3})\.(?P<sha>[0-9a-f]{16})$")


def _store_parts(incoming: Path, store: Path) -> list[str]:
    """Copy the parts that arrived (they may come a few at a time, into a folder a transfer
    replaces) into the store that outlives the invocation; returns the names newly stored."""
    moved = []
    if incoming.is_dir():
        store.mkdir(parents=True, exist_ok=True)
        for p in sorted(incoming.iterdir()):
            dest = store / p.name
            if _PART.match(p.name) and not (dest.is_file() and dest.stat().st_size == p.stat().st_size):
                shutil.copy2(p, dest)
                moved.append(p.name)
    return moved


def _join_parts(store: Path, models: Path, pins: dict) -> dict:
    """Join every model whose parts are all stored; keep it only if its sha256 is the pin's."""
    out: dict = {}
    groups: dict = {}
    for p in sorted(store.glob("*")) if store.is_dir() else ():
        m = _PART.match(p.name)
        if m:
            groups.setdefault((m["name"], m["n"], m["sha"]), []).append(p)
    for (name, n, sha16), parts in groups.items():
        dest = models / f"{name}.gguf"
        if dest.exists():
            out[name] = "already there"
            continue
        if len(parts) != int(n):
            out[name] = f"{len(parts)} of {int(n)} parts so far"
            continue
        pin = pins.get(name)
        if pin is None or pin["sha256"][:16] != sha16:
            out[name] = "parts of a model that models.toml does not pin: ignored"
            continue
        tmp = dest.with_suffix(".gguf.joining")
        with open(tmp, "wb") as f:
            for part in sorted(parts):
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 22)
        digest = sha256_of(tmp)
        if digest != pin["sha256"]:
            tmp.unlink()
            out[name] = f"joined file's sha256 {digest[:16]}... is not the pin's: parts dropped"
            for part in parts:
                part.unlink()
            continue
        tmp.rename(dest)
        out[name] = "joined and verified"
    return out


def summarize_bench(data: dict) -> dict:
    """Per configuration: median decode tok/s, acceptance and requests, from bench.json."""
    import statistics
    by: dict = {}
    for rec in data.get("records", []):
        if rec.get("warmup") or "error" in rec:
            by.setdefault(rec.get("config", "?"), {"rates": [], "acc": [], "errors": 0})["errors"] += \
                1 if "error" in rec else 0
            continue
        e = by.setdefault(rec.get("config", "?"), {"rates": [], "acc": [], "errors": 0})
        if rec.get("decode_tokens_per_second") is not None:
            e["rates"].append(float(rec["decode_tokens_per_second"]))
        if rec.get("acceptance_rate") is not None:
            e["acc"].append(float(rec["acceptance_rate"]))
    return {k: {"decode_tok_s": statistics.median(v["rates"]) if v["rates"] else 0.0,
                "acceptance": statistics.mean(v["acc"]) if v["acc"] else None,
                "requests": len(v["rates"]), "errors": v["errors"]} for k, v in by.items()}


def _results_table(w, title: str, det: dict) -> None:
    res = det.get("results")
    if not res:
        return
    w(f"\n## {title}\n\n| configuration | decode tok/s (median) | acceptance | requests | errors |\n"
      "|---|---|---|---|---|\n")
    for k, v in res.items():
        acc = f"{v['acceptance']:.0%}" if v.get("acceptance") is not None else "-"
        w(f"| {k} | {v['decode_tok_s']:.1f} | {acc} | {v['requests']} | {v['errors']} |\n")
    for line in det.get("overall", []):
        w(f"\n    {line}")
    w("\n")


def render_markdown(rep: dict) -> str:
    out = io.StringIO()
    w = out.write
    w(f"# edgespec GPU check ({rep['mode']})\n\n")
    w(f"Started {rep['started']}, updated {rep.get('updated', '')}; `tools/device_check.py`, "
      f"{len(rep.get('invocations', []))} invocation(s).\n\n")
    w("| stage | status | seconds | budget | summary |\n|---|---|---|---|---|\n")
    for name in STAGES:
        s = rep["stages"].get(name)
        if s is None:
            w(f"| {name} | not run | | | |\n")
            continue
        summary = str(s.get("summary", "")).replace("|", "\\|").replace("\n", " ")
        w(f"| {name} | {s['status']} | {s.get('seconds', '')} | {s.get('budget_s', '')} | {summary} |\n")
    stages = rep["stages"]
    cal = stages.get("calibrate", {}).get("details", {}).get("calibration")
    if cal:
        w("\n## Verify-cost curve and exactness\n\n")
        w(f"One step {cal['step_seconds'] * 1000:.3f} ms ({cal.get('model', '')}, GPU layers "
          f"{cal.get('gpu_layers')}); exact passes up to {cal['exact_max_tokens']} tokens.\n\n")
        w("| tokens per pass | " + " | ".join(str(n) for n, _ in cal["points"]) + " |\n")
        w("|---|" + "---|" * len(cal["points"]) + "\n")
        w("| cost (steps) | " + " | ".join(f"{c:.2f}" for _, c in cal["points"]) + " |\n")
    for name in ("bench", "proposers", "trees"):
        det = stages.get(name, {}).get("details", {})
        _results_table(w, name, det)
        if name == "proposers" and det.get("mtp"):
            _results_table(w, "proposers: mtp on the tiny NextN GGUF (plumbing, not speed)",
                           det["mtp"])
    missing = []
    models = stages.get("models", {}).get("details", {}).get("missing", {})
    for n, m in models.items():
        missing.append(f"model {n} ({m['size']}): not on this machine")
    for name in STAGES:
        s = stages.get(name)
        if s and s["status"] != "ok":
            missing.append(f"stage {name}: {s['status']}: {s.get('summary', '')}")
        for k, v in (s or {}).get("details", {}).get("not_run", {}).items():
            missing.append(f"proposer {k}: {v}")
        if s and s.get("details", {}).get("draft_pair"):
            missing.append(f"draft pair: {s['details']['draft_pair']}")
    if missing:
        w("\n## Missing, and why\n\n" + "".join(f"- {x}\n" for x in missing))
    return out.getvalue()


# --- pack: a bundle for an offline machine ---------------------------------------------------
def pack(args: argparse.Namespace) -> int:
    """Write the bundle (with network): the slim sdist, the wheels; the model parts beside it."""
    bundle = Path(args.bundle)
    bundle.mkdir(parents=True, exist_ok=True)
    sdist_full = Path(args.sdist) if args.sdist else None
    if sdist_full is None:
        dl = STATE / "download"
        dl.mkdir(parents=True, exist_ok=True)
        found = sorted(dl.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                            "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_VERSION}", "-d", str(dl)],
                           check=True)
            found = sorted(dl.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"))
        sdist_full = found[0]
    kept, dropped = slim_sdist(sdist_full, bundle / SDIST)
    print(f"{SDIST}: {mib((bundle / SDIST).stat().st_size)} ({kept} files kept, {dropped} dropped)")
    wheels = bundle / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", args.python_version, "--implementation", "cp", "-d", str(wheels)]
    for plat in args.platform or ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                  "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]:
        cmd += ["--platform", plat]
    subprocess.run(cmd + list(WHEELS), check=True)
    pins = registry_models()
    manifest = {"llama_cpp_python": LLAMA_CPP_VERSION, "sdist": SDIST,
                "wheels": sorted(p.name for p in wheels.glob("*.whl")), "parts": {}}
    store, parts = Path(args.models_from).expanduser(), Path(args.parts_dir)
    for name in filter(None, args.models.split(",")):
        path = store / f"{name}.gguf"
        if name not in pins or not path.is_file():
            print(f"{name}: not in models.toml or not at {path}; skipped")
            continue
        manifest["parts"][name] = split_model(path, name, pins[name]["sha256"], parts,
                                              int(args.part_mib * 2**20))
    (bundle / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    print(f"{bundle}: {mib(size)}")
    for name, names in manifest["parts"].items():
        print(f"{name}: {len(names)} parts of at most {args.part_mib:g} MiB in {parts}; on the GPU "
              f"machine, put them (all, or some per invocation) in {bundle / 'parts'}")
    return 0


def _calibrate_main(args: argparse.Namespace) -> int:
    """The calibrate stage's child: one fresh measurement, printed as one JSON line."""
    from edgespec.calibration import cache as calibration
    from edgespec.runtime.kernel import KernelConfig

    cal = calibration.load_or_measure(args.model, n_gpu_layers=args.gpu_layers, force=True,
                                      repeats=args.repeats, kernel=KernelConfig())
    print("CALIBRATION", json.dumps({
        "model": Path(args.model).name, "gpu_layers": args.gpu_layers,
        "step_seconds": cal.step_seconds, "points": [list(p) for p in cal.points],
        "exact_max_tokens": cal.exact_max_tokens, "exact_max_drafts": cal.exact_max_drafts,
        "busy": round(cal.busy, 3), "device": dict(cal.device)}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/device_check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the stages and write the report")
    r.add_argument("--dry-run", action="store_true",
                   help="no GPU needed: SmolLM2-135M, the CPU backend, nothing compiled")
    r.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, from {', '.join(STAGES)}")
    r.add_argument("--deadline", type=float, default=float(sum(BUDGETS.values())),
                   help="seconds for the whole invocation [default: the sum of the budgets]")
    r.add_argument("--budget", action="append", default=[], metavar="STAGE=SECONDS")
    r.add_argument("--out", default=None, help="report folder [default: WORK/out]")
    r.add_argument("--json", default=None, metavar="PATH",
                   help="the JSON report [default: OUT/report.json]")
    r.add_argument("--work", default=str(WORK), help="build and state folder [default: .gpucheck/work]")
    r.add_argument("--bundle", default=str(BUNDLE),
                   help="what `pack` wrote: sdist, wheels/, parts/ [default: .gpucheck/bundle]")
    r.add_argument("--sdist", default=None, help=f"llama-cpp-python sdist [default: BUNDLE/{SDIST}]")
    r.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES [default: the GPU's]")
    r.add_argument("--models-dir", action="append", default=[], help="another folder of NAME.gguf files")
    r.add_argument("--target", default=None, help="registry name of the target [default: qwen-1.5b, "
                                                  "else smollm2-135m]")
    r.add_argument("--draft", default=None, help="registry name of the draft [default: qwen-0.5b]")
    r.add_argument("--fresh", action="store_true", help="start a new report instead of adding to the last")
    p = sub.add_parser("pack", help="write the bundle for an offline GPU machine (needs network)")
    p.add_argument("--bundle", default=str(BUNDLE), help="where [default: .gpucheck/bundle]")
    p.add_argument("--sdist", default=None, help="a downloaded llama-cpp-python sdist to slim")
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python, for the wheels")
    p.add_argument("--platform", action="append", default=[],
                   help="pip --platform of the wheels [default: manylinux x86_64]")
    p.add_argument("--parts-dir", default=str(PARTS), help="where model parts go [default: "
                                                           ".gpucheck/parts]")
    p.add_argument("--part-mib", type=float, default=PART_BYTES / 2**20,
                   help="part size in MiB, for transfers with a size limit")
    p.add_argument("--models", default="smollm2-135m,qwen-0.5b,qwen-1.5b",
                   help="models to cut into parts (comma-separated registry names)")
    p.add_argument("--models-from", default=str(Path.home() / ".cache" / "edgespec" / "models"))
    c = sub.add_parser("_calibrate")  # the calibrate stage's child process
    c.add_argument("--model", required=True)
    c.add_argument("--gpu-layers", type=int, default=0)
    c.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        return pack(args)
    if args.cmd == "_calibrate":
        return _calibrate_main(args)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        ap.error(f"unknown stage(s) {', '.join(bad)}; choose from {', '.join(STAGES)}")
    check = Check(args)
    print(f"[gpu-check] {check.report['mode']}: stages {', '.join(stages)}; report in {check.out}",
          flush=True)
    for name in STAGES:  # always in pipeline order, whatever order they were named in
        if name in stages:
            check.stage(name)
    failed = [n for n in stages if check.report["stages"][n]["status"] in ("failed", "timeout")]
    print(f"[gpu-check] report: {check.out / 'report.md'}, {check.json_path}" +
          (f"; not ok: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
