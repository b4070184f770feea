"""Why the verify curve bends: CPU time of n-token passes, per layout and per ggml kernel.

Wall-clock timings on a shared machine are noise, so everything here is CPU time of the
measuring process (``time.process_time``: every thread's time on a core, not the time it
waited for one) or perf's software ``cpu-clock`` samples (virtual machines often expose no
hardware cycle counter; ``perf stat -e cycles`` then says "not supported"). Both still
count a spinning thread-pool barrier as work: with 2 threads on a loaded machine the
waiting thread spins, which the per-kernel table shows as its own line (sync).

    # the curve per layout, one process per layout, all n round-robin (CPU-s per pass)
    python tools/verify_curve.py curve MODEL --threads 1 --layout repack --layout plain
    # where a pass of n tokens spends its time (one perf record per n, counting only passes)
    python tools/verify_curve.py record MODEL --threads 1 --n 1 --n 4 --n 16 --out /tmp/vc
    # a copy whose Q6_K tensors are Q8_0, unregistered (the product's is `edgespec models
    # optimize`; llama-quantize from `make anchors`, or --quantize)
    python tools/verify_curve.py relayout MODEL /tmp/qwen-1.5b-q6q8.gguf
    # the original and the copy interleaved in one process (same load for both)
    python tools/verify_curve.py pair MODEL /tmp/qwen-1.5b-q6q8.gguf --threads 1
    # greedy agreement of a re-laid copy with the original
    python tools/verify_curve.py agree MODEL COPY --tokens 48

``drive`` is the inner loop ``record`` runs under perf: it loads the model, decodes a
prefix, then enables perf through its control fifo only around the timed passes, so
loading and repacking the weights never enter a profile.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NS = (1, 2, 4, 8, 16)
LAYOUTS = ("repack", "plain")

#: ggml CPU kernels -> what they are, first match wins. Q4_K tensors are repacked into 8x8
#: tiles on AVX2 (gemm for each whole group of 4 rows of a pass, gemv for each leftover row);
#: Q6_K and Q8_0 are not repacked on x86 and go through ggml's generic mul_mat (one
#: vec_dot per weight row x token) or llamafile's tinyBLAS (Q8_0 batches).
CATEGORIES: tuple[tuple[str, str], ...] = (
    (r"gemm_(?P<t>q\d_K|q\d_\d)_\d+x\d+", "{T} repacked gemm (4-row tiles)"),
    (r"gemv_(?P<t>q\d_K|q\d_\d)_\d+x\d+", "{T} repacked gemv (1 row)"),
    (r"vec_dot_(?P<t>q\d_K|q\d_\d)_q8", "{T} vec_dot (not repacked)"),
    (r"tinyBLAS|llamafile_sgemm", "llamafile tinyBLAS (Q8_0/Q4_0 gemm)"),
    (r"tiled_|mul_mat_tiled", "tiled K-quant matmul (not repacked, n >= 8)"),
    (r"flash_attn|soft_max|vec_dot_f16|vec_mad_f16|vec_dot_f32|rope|expf|dequantize_row_q8_0"
     r"|fwht", "attention"),
    (r"quantize_row|quantize_mat|from_float|fp32_to_fp16|fp16_to_fp32", "quantize activations"),
    (r"\bgomp_|GOMP_|\bomp_|ggml_barrier|sched_yield|futex|\bspin|chunk_add", "sync / spin"),
    (r"memcpy|memmove|memset|get_rows", "copies (logits, rows)"),
    (r"rms_norm|vec_add|vec_mul|silu|swiglu|ggml_compute_forward_(add|mul|cpy|scale)\b",
     "elementwise"),
    (r"ggml_compute_forward_mul_mat", "mul_mat driver (chunking, row loop)"),
)
OTHER = "other"
KERNEL = "kernel (page faults, syscalls)"

#: a row of ``perf report --stdio --sort dso,symbol``: "  4.32%  libggml-cpu.so  [.] sym";
#: columns are padded with 2+ spaces (perf may append IPC columns after the symbol)
_REPORT_LINE = re.compile(r"^\s*(?P<pct>\d+(?:\.\d+)?)%\s+(?:(?P<dso>\S+)\s+)?"
                          r"\[(?P<kind>[.k])\]\s+(?P<sym>.+?)(?:\s{2,}.*)?$")


@dataclass(frozen=True)
class Sample:
    """One symbol's share of a perf profile."""

    symbol: str
    percent: float
    kernel_space: bool
    dso: str = ""


def parse_report(text: str) -> list[Sample]:
    """The rows of ``perf report --stdio --sort dso,symbol`` (or ``--sort symbol``);
    comments and blank lines skipped."""
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _REPORT_LINE.match(line)
        if m:
            out.append(Sample(m["sym"].strip(), float(m["pct"]), m["kind"] == "k",
                              m["dso"] or ""))
    return out


def categorize(symbol: str, kernel_space: bool = False, dso: str = "") -> str:
    if kernel_space or dso.startswith("[kernel"):
        return KERNEL
    if symbol.startswith("0x") and " (" in symbol:
        # placed by name_unresolved: the next exported function first, then the previous
        for where in symbol.split(" (", 1)[1].rstrip(")").split("; "):
            found = categorize(where.split(" ", 1)[1], False, "")
            if found != OTHER:
                return found
        symbol = symbol.split(" (", 1)[0]
    for pattern, name in CATEGORIES:
        m = re.search(pattern, symbol)
        if m:
            t = m.groupdict().get("t")
            return name.replace("{T}", t.upper() if t else "")
    if symbol.startswith("0x") and "ggml-cpu" in dso:
        return "ggml-cpu, unnamed (static)"
    if "python" in dso or dso.startswith("libpython"):
        return "Python"
    return OTHER


def exported_symbols(path: str) -> list[tuple[int, str]]:
    """(address, name) of a shared library's exported functions, sorted (``nm -D``)."""
    res = subprocess.run(["nm", "-D", "--defined-only", "-C", path], capture_output=True,
                         text=True)
    out = []
    for line in res.stdout.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] in "TtWw":
            out.append((int(parts[0], 16), parts[2]))
    return sorted(out)


def name_unresolved(samples: list[Sample], symbols: dict[str, list[tuple[int, str]]]
                    ) -> list[Sample]:
    """Give a bare address (a static function: ggml-cpu exports only part of its code) the
    names of the exported functions around it, ``0x... (before NEXT; after PREV)``. Static
    code is laid out with the rest of its source file, usually ahead of the file's exported
    functions, so NEXT is the better guess at what it is, and categorize() tries it first
    (checked by disassembly for the large ones: docs/benchmarks.md)."""
    out = []
    for s in samples:
        table = symbols.get(s.dso)
        if table and s.symbol.startswith("0x"):
            addr = int(s.symbol, 16)
            prev = [name for a, name in table if a <= addr]
            nxt = [name for a, name in table if a > addr]
            if prev or nxt:
                where = "; ".join(([f"before {nxt[0]}"] if nxt else [])
                                  + ([f"after {prev[-1]}"] if prev else []))
                s = Sample(f"{s.symbol} ({where})", s.percent, s.kernel_space, s.dso)
        out.append(s)
    return out


def _library_symbols() -> dict[str, list[tuple[int, str]]]:
    """Exported symbols of the llama.cpp libraries the engine loads, by file name."""
    # find_spec only locates the package: nothing of llama.cpp is loaded into this process
    import importlib.util
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return {}
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    return {p.name: exported_symbols(str(p)) for p in sorted(lib.glob("libggml*.so*"))
            if not p.is_symlink() or p.name.endswith(".so.0")}


def by_category(samples: list[Sample]) -> dict[str, float]:
    """Percent of the profile per category, largest first."""
    acc: dict[str, float] = {}
    for s in samples:
        key = categorize(s.symbol, s.kernel_space, s.dso)
        acc[key] = acc.get(key, 0.0) + s.percent
    return dict(sorted(acc.items(), key=lambda kv: -kv[1]))


# --- the driver (runs in its own process, under perf or not) -----------------------------
def _load(model_path: str, repack: bool):
    # deferred: the runtime loads llama.cpp's libraries; parse-only uses (the tests) skip it
    from edgespec.runtime.model import load_model
    return load_model(model_path, use_extra_bufts=repack)


def _tokens(model, n: int) -> list[int]:
    vocab = max(int(model.n_vocab), 2)
    return [(1000 + 7919 * i) % vocab for i in range(n)]


class _PerfControl:
    """perf's ``--control fifo:CTL,ACK``: enable counting only around the measured passes."""

    def __init__(self, ctl: str | None, ack: str | None) -> None:
        self.ctl = open(ctl, "w") if ctl else None
        self.ack = open(ack) if ctl and ack else None

    def _say(self, word: str) -> None:
        if self.ctl:
            self.ctl.write(word + "\n")
            self.ctl.flush()
            if self.ack:
                self.ack.readline()

    def enable(self) -> None:
        self._say("enable")

    def disable(self) -> None:
        self._say("disable")


def drive(model_path: str, ns: list[int], reps: int, threads: int, repack: bool,
          ubatch: int, prefix: int, ctl: str | None = None, ack: str | None = None) -> dict:
    """CPU seconds (and wall seconds) per pass of each n, all-row logits, round-robin over n
    so that drift hits every n alike; the KV cache is trimmed back after each pass."""
    from edgespec.calibration.measuring import context_options  # deferred: as _load
    from edgespec.runtime.kernel import KernelConfig
    model = _load(model_path, repack)
    kmax = max(ns)
    ctx = model.new_context(n_ctx=prefix + kmax + 8, n_batch=ubatch, n_threads=threads,
                            **context_options(KernelConfig(repack=repack)))
    toks = _tokens(model, prefix + kmax)
    for start in range(0, prefix, ubatch):  # the prefix in chunks the context accepts
        ctx.decode(toks[start:min(prefix, start + ubatch)], start, logits="none")
    cpu: dict[int, list[float]] = {n: [] for n in ns}
    wall: dict[int, list[float]] = {n: [] for n in ns}

    def one_pass(n: int) -> None:
        # a pass longer than n_ubatch runs as llama.cpp runs it: one graph per micro-batch,
        # each with logits for all its rows (verification needs every row; a row without
        # logits skips the output projection, a large share of the cost)
        for start in range(0, n, ubatch):
            ctx.decode(toks[prefix + start:prefix + min(n, start + ubatch)], prefix + start,
                       logits="all")
        ctx.trim(0, prefix)

    for n in ns:  # warm-up: first-touch of buffers, the thread pool
        one_pass(n)
    perf = _PerfControl(ctl, ack)
    perf.enable()
    for _ in range(reps):
        for n in ns:
            c0, w0 = time.process_time(), time.perf_counter()
            one_pass(n)
            cpu[n].append(time.process_time() - c0)
            wall[n].append(time.perf_counter() - w0)
    perf.disable()
    ctx.close()
    model.close()
    return {"cpu": {n: statistics.median(v) for n, v in cpu.items()},
            "wall": {n: statistics.median(v) for n, v in wall.items()},
            "threads": threads, "repack": repack, "ubatch": ubatch, "model": model_path}


def pair(models: list[str], ns: list[int], reps: int, threads: int, ubatch: int,
         prefix: int) -> dict:
    """Several GGUF files in one process, passes round-robin over (file, n): the files'
    curves and their 1-token passes compared under the same load, which separate processes
    on a shared machine cannot do (their ratios moved by ~15% between processes here)."""
    from edgespec.calibration.measuring import context_options  # deferred: as _load
    from edgespec.runtime.kernel import KernelConfig
    kmax = max(ns)
    loaded = []
    for path in models:
        model = _load(path, True)
        ctx = model.new_context(n_ctx=prefix + kmax + 8, n_batch=max(ubatch, prefix),
                                n_threads=threads, **context_options(KernelConfig()))
        toks = _tokens(model, prefix + kmax)
        ctx.decode(toks[:prefix], 0, logits="none")
        loaded.append((path, model, ctx, toks))
    cpu: dict[tuple[str, int], list[float]] = {(m, n): [] for m in models for n in ns}
    wall: dict[tuple[str, int], list[float]] = {(m, n): [] for m in models for n in ns}
    for rep in range(reps + 1):  # the first round warms up and is not kept
        for path, _model, ctx, toks in loaded:
            for n in ns:
                c0, w0 = time.process_time(), time.perf_counter()
                ctx.decode(toks[prefix:prefix + n], prefix, logits="all")
                if rep:
                    cpu[(path, n)].append(time.process_time() - c0)
                    wall[(path, n)].append(time.perf_counter() - w0)
                ctx.trim(0, prefix)
    for _path, model, ctx, _toks in loaded:
        ctx.close()
        model.close()
    return {clock: {m: {n: statistics.median(got[(m, n)]) for n in ns} for m in models}
            for clock, got in (("cpu", cpu), ("wall", wall))}


def cmd_pair(a) -> None:
    ns = sorted(set(a.n or DEFAULT_NS) | {1})
    if len({a.model, *a.copy}) != 1 + len(a.copy):
        raise SystemExit("pair wants different files")
    both = pair([a.model] + a.copy, ns, a.reps, a.threads, 512, a.prefix)
    # CPU time is what a shared machine can measure; wall time is what counts on a quiet one
    for clock, res in both.items():
        base = res[a.model][1]
        print(f"{clock} steps per pass, files interleaved in one process ({a.threads} thread(s))")
        print(f"| file | 1-token {clock} ms (x the first file's) | "
              + " | ".join(f"n={n}" for n in ns) + " |")
        print("|---|---|" + "---|" * len(ns))
        for m, cur in res.items():
            print(f"| {Path(m).name} | {cur[1] * 1000:.1f} ({cur[1] / base:.2f}x) | "
                  + " | ".join(f"{cur[n] / cur[1]:.2f}" for n in ns) + " |")


def _drive_cmd(a, ns: list[int], repack: bool, threads: int, ubatch: int, model: str,
               reps: int) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "drive", model, "--threads", str(threads),
           "--reps", str(reps), "--ubatch", str(ubatch), "--prefix", str(a.prefix)]
    cmd += [x for n in ns for x in ("--n", str(n))]
    return cmd + ([] if repack else ["--no-repack"])


def parse_env(pairs: list[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` switches for the driver's environment (e.g. GGML_CPU_TILED_MM=0)."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env wants KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def _run_drive(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    res = subprocess.run(cmd, capture_output=True, text=True,
                         env={**os.environ, **env} if env else None)
    if res.returncode != 0:
        raise SystemExit(f"driver failed ({res.returncode}): {res.stderr[-2000:]}")
    for line in reversed(res.stdout.splitlines()):
        if line.startswith("{"):
            out = json.loads(line)
            out["cpu"] = {int(k): v for k, v in out["cpu"].items()}
            out["wall"] = {int(k): v for k, v in out["wall"].items()}
            return out
    raise SystemExit(f"driver printed no result: {res.stdout[-1000:]}")


def curve_rows(result: dict) -> list[tuple[int, float, float]]:
    """(n, CPU ms per pass, CPU steps = pass / 1-token pass) for a driver result."""
    base = result["cpu"][1]
    return [(n, 1000 * c, c / base) for n, c in sorted(result["cpu"].items())]


def cmd_curve(a) -> None:
    ns = sorted(set(a.n or DEFAULT_NS) | {1})
    models = [a.model] + list(a.copy or [])
    env = parse_env(a.env)
    label = " ".join(f"{k}={v}" for k, v in env.items()) or "-"
    print("| model | layout | threads | n_ubatch | env | " + " | ".join(f"n={n}" for n in ns)
          + " | 1-token ms (CPU) |")
    print("|---|---|---|---|---|" + "---|" * len(ns) + "---|")
    for model in models:
        for layout in a.layout or ["repack"]:
            for threads in a.threads:
                for ubatch in a.ubatch:
                    r = _run_drive(_drive_cmd(a, ns, layout == "repack", threads, ubatch, model,
                                              a.reps), env)
                    rows = curve_rows(r)
                    print(f"| {Path(model).name} | {layout} | {threads} | {ubatch} | {label} | "
                          + " | ".join(f"{s:.2f}" for _, _, s in rows)
                          + f" | {rows[0][1]:.1f} |", flush=True)


def cmd_record(a) -> None:
    perf = shutil.which("perf")
    if not perf:
        raise SystemExit("perf not found: apt-get install linux-perf")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ns = a.n or list(DEFAULT_NS)
    tables: dict[int, dict[str, float]] = {}
    cpu: dict[int, float] = {}
    symbols = _library_symbols()
    for n in ns:
        tag = f"{Path(a.model).stem}-n{n}-t{a.threads}-{a.layout}-u{a.ubatch}" + "".join(
            f"-{k}{v}" for k, v in parse_env(a.env).items())
        data = out / f"perf-{tag}.data"
        with tempfile.TemporaryDirectory() as tmp:
            ctl, ack = os.path.join(tmp, "ctl"), os.path.join(tmp, "ack")
            os.mkfifo(ctl)
            os.mkfifo(ack)
            cmd = [perf, "record", "-q", "-e", "cpu-clock", "-F", str(a.freq), "-D", "-1",
                   "--control", f"fifo:{ctl},{ack}", "-o", str(data), "--"]
            cmd += _drive_cmd(a, [n], a.layout == "repack", a.threads, a.ubatch, a.model,
                              a.reps)
            cmd += ["--ctl", ctl, "--ack", ack]
            r = _run_drive(cmd, parse_env(a.env))
        cpu[n] = r["cpu"][n]
        rep = subprocess.run([perf, "report", "--stdio", "--sort", "dso,symbol", "-i", str(data)],
                             capture_output=True, text=True, check=True).stdout
        (out / f"report-{tag}.txt").write_text(rep)
        tables[n] = by_category(name_unresolved(parse_report(rep), symbols))
    base = cpu.get(1)
    cats = list(dict.fromkeys(c for t in tables.values() for c in t))
    print(f"CPU ms per pass, by kernel ({Path(a.model).name}, {a.layout}, "
          f"{a.threads} thread(s)); share of the profile x CPU time of the pass")
    print("| kernel | " + " | ".join(f"n={n}" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for c in cats:
        print(f"| {c} | " + " | ".join(f"{tables[n].get(c, 0.0) / 100 * cpu[n] * 1000:.1f}"
                                       for n in ns) + " |")
    print("| **total** | " + " | ".join(f"{cpu[n] * 1000:.1f}" for n in ns) + " |")
    if base:
        print("| steps | " + " | ".join(f"{cpu[n] / base:.2f}" for n in ns) + " |")


def _greedy(model, ctx, ids: list[int], count: int) -> list[int]:
    ctx.clear()
    row = ctx.decode(ids, 0, logits="last")[0]
    seq = []
    for i in range(count):
        seq.append(int(row.argmax()))
        row = ctx.decode([seq[-1]], len(ids) + i, logits="last")[0]
    return seq


def _forced(ctx, ids: list[int], seq: list[int]) -> list[int]:
    """The model's greedy choice at each position of ``seq``, fed the reference tokens (one
    pass, every row): per-position agreement, without one early divergence deciding the rest."""
    ctx.clear()
    rows = ctx.decode(ids + seq[:-1], 0, logits="all")
    return [int(r.argmax()) for r in rows[len(ids) - 1:]]


def cmd_agree(a) -> None:
    # deferred: as _load
    from edgespec.runtime.kernel import KernelConfig
    from edgespec.calibration.measuring import context_options
    prompts = a.prompt or [
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "The three laws of thermodynamics are",
        "Q: Convert this CSV to JSON lines.\nname,age\nann,31\nbob,27\nA:",
        "import os\n\n\ndef list_python_files(root):\n",
    ]
    greedy: dict[str, list[list[int]]] = {}
    forced: dict[str, list[list[int]]] = {}
    ref: list[list[int]] = []
    for path in (a.model, a.copy):
        model = _load(path, True)
        ctx = model.new_context(n_ctx=512, n_batch=512, n_threads=a.threads,
                                **context_options(KernelConfig()))
        ids_all = [list(model.tokenize(p)) for p in prompts]
        greedy[path] = [_greedy(model, ctx, ids, a.tokens) for ids in ids_all]
        ref = ref or greedy[path]  # the original's greedy text is the reference for both
        forced[path] = [_forced(ctx, ids, seq) for ids, seq in zip(ids_all, ref)]
        ctx.close()
        model.close()
    n = a.tokens * len(prompts)

    def prefix(x: list[int], y: list[int]) -> int:
        return next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x))

    for i, p in enumerate(prompts):
        print(f"{p[:36]!r}: copy's greedy text equal for {prefix(ref[i], greedy[a.copy][i])}"
              f"/{a.tokens} tokens; teacher-forced agreement: original (one pass) "
              f"{sum(u == v for u, v in zip(ref[i], forced[a.model][i]))}, copy "
              f"{sum(u == v for u, v in zip(ref[i], forced[a.copy][i]))} of {a.tokens}")
    same = sum(prefix(x, y) for x, y in zip(ref, greedy[a.copy]))
    f0 = sum(u == v for x, y in zip(ref, forced[a.model]) for u, v in zip(x, y))
    f1 = sum(u == v for x, y in zip(ref, forced[a.copy]) for u, v in zip(x, y))
    print(f"all: identical greedy prefix {same}/{n} ({same / n:.0%}); teacher-forced top-1 "
          f"agreement with the original's greedy tokens: original in one pass {f0}/{n} "
          f"({f0 / n:.0%}), copy {f1}/{n} ({f1 / n:.0%})")


def cmd_relayout(a) -> None:
    """The product's re-layout (edgespec.registry.optimize, `edgespec models optimize`)
    written to any path and to any type, unregistered: for measuring layouts."""
    # deferred: as _load
    from edgespec.registry.optimize import Q6_K, find_quantize, relayout_types
    from edgespec.runtime.gguf_header import read_gguf_header
    quantize = find_quantize(a.quantize)
    info = read_gguf_header(a.model)
    lines = relayout_types(info.tensors, dst=a.to)
    changed = sum(1 for t in info.tensors if t.ggml_type == Q6_K)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    cmd = [str(quantize), "--allow-requantize", "--tensor-type-file", f.name, a.model, a.out,
           "Q4_K_M", str(a.threads)]
    print(" ".join(cmd), f"# {changed} Q6_K tensors -> {a.to}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if not a.verbose else None)
    after = read_gguf_header(a.out)
    left = [t.name for t in after.tensors if t.ggml_type == Q6_K]
    if left:
        raise SystemExit(f"{len(left)} tensors are still Q6_K in {a.out}: {left[:3]}")
    print(f"wrote {a.out} ({after.file_size / 1e6:.0f} MB; source {info.file_size / 1e6:.0f} MB)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drive", help="the measured loop (one process)")
    d.add_argument("model")
    d.add_argument("--n", type=int, action="append")
    d.add_argument("--reps", type=int, default=8)
    d.add_argument("--threads", type=int, default=1)
    d.add_argument("--no-repack", action="store_true")
    d.add_argument("--ubatch", type=int, default=512)
    d.add_argument("--prefix", type=int, default=64)
    d.add_argument("--ctl")
    d.add_argument("--ack")
    for name in ("curve", "record"):
        p = sub.add_parser(name)
        p.add_argument("model")
        p.add_argument("--n", type=int, action="append")
        p.add_argument("--reps", type=int, default=8)
        p.add_argument("--prefix", type=int, default=64)
        p.add_argument("--env", action="append", help="KEY=VALUE for the driver, repeatable")
    c = sub.choices["curve"]
    c.add_argument("--copy", action="append", help="another GGUF (a re-laid copy) to measure")
    c.add_argument("--layout", action="append", choices=LAYOUTS)
    c.add_argument("--threads", type=int, action="append")
    c.add_argument("--ubatch", type=int, action="append")
    r = sub.choices["record"]
    r.add_argument("--layout", choices=LAYOUTS, default="repack")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--ubatch", type=int, default=512)
    r.add_argument("--freq", type=int, default=2000)
    r.add_argument("--out", default="/tmp/verify_curve")
    pr = sub.add_parser("pair", help="several files' curves interleaved in one process")
    pr.add_argument("model")
    pr.add_argument("copy", nargs="+")
    pr.add_argument("--n", type=int, action="append")
    pr.add_argument("--reps", type=int, default=6)
    pr.add_argument("--prefix", type=int, default=64)
    pr.add_argument("--threads", type=int, default=1)
    g = sub.add_parser("agree")
    g.add_argument("model")
    g.add_argument("copy")
    g.add_argument("--tokens", type=int, default=48)
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--prompt", action="append")
    q = sub.add_parser("relayout", help="a copy whose Q6_K tensors are another type")
    q.add_argument("model")
    q.add_argument("out")
    q.add_argument("--to", default="q8_0")
    q.add_argument("--quantize", help="path of llama-quantize")
    q.add_argument("--threads", type=int, default=2)
    q.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "drive":
        ns = sorted(set(a.n or DEFAULT_NS))
        if min(ns) < 1:
            raise SystemExit("pass sizes must be >= 1")
        print(json.dumps(drive(a.model, ns, a.reps, a.threads, not a.no_repack, a.ubatch,
                               a.prefix, a.ctl, a.ack)))
    elif a.cmd == "curve":
        a.threads = a.threads or [1]
        a.ubatch = a.ubatch or [512]
        cmd_curve(a)
    elif a.cmd == "record":
        cmd_record(a)
    elif a.cmd == "pair":
        cmd_pair(a)
    elif a.cmd == "relayout":
        cmd_relayout(a)
    else:
        cmd_agree(a)


if __name__ == "__main__":
    main()
