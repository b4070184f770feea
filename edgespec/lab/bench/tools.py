"""llama.cpp's own programs as benchmark anchors: command lines, a run, and their timing output.

Each request runs the tool once on the exact prompt text the engine tokenized (the runner
checks that the tool's tokenization gives the same tokens), with the engine's context size and
threads, greedy by default. The kernel configuration (KV cache type, flash attention, weight
repacking) is llama.cpp's own default: an anchor stands for what a user would otherwise run,
so it must not inherit ours (``ToolSetup.llama_defaults=False`` gives it the engine's).

What the tools print (read in the vendored llama.cpp source, ``make anchors`` unpacks it):

* ``llama-completion``: ``common_perf_print`` on stderr: ``prompt eval time = X ms / N tokens``
  (the prompt batch), ``eval time = Y ms / M runs`` (one single-token decode per generated
  token but the last) and ``sampling time = S ms`` (every sample). Its decode time is
  Y + S x M / (M + 1): the decodes plus the samples that followed the first.
* ``llama-lookup`` and ``llama-speculative-simple``: ``encoded N tokens in X seconds``,
  ``decoded P tokens in Y seconds`` (wall clock of the generation loop), ``n_drafted = D``,
  ``n_accept = A``. Their ``eval time`` is useless here: llama.cpp books every multi-token
  batch, verify passes included, as prompt evaluation.
  - llama-lookup evaluates the whole prompt while "encoding" and samples the first token
    from its logits inside the loop: the loop *computed* P - 1 tokens, in P - 1 - A passes.
  - llama-speculative-simple encodes all but the last prompt token, which goes into its
    first verify pass: the loop computed all P tokens, in P - A passes.
  Decode speed is tokens computed in the loop per second of it: the same definition as
  ours (generated tokens after the one the prefill produced, over the time after prefill).
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ...errors import EdgespecError
from .anchors.paths import ENV_VAR, anchors_bin_dir

STDERR_TAIL = 1200  # characters of a failed tool's stderr kept in its error record


class AnchorsNotBuiltError(EdgespecError):
    """A llama.cpp anchor was asked for but its program is not there."""


class ToolOutputError(EdgespecError):
    """A tool ran but printed no timing we can read."""


@dataclass(frozen=True)
class ToolTiming:
    """What a tool reported about one generation."""

    prompt_tokens: int
    prefill_seconds: float
    generated: int  # tokens the tool produced (an end-of-generation token included)
    decode_tokens: int  # of those, the ones computed after the prefill
    decode_seconds: float
    drafted: int | None = None
    accepted: int | None = None
    passes: int | None = None  # target passes after the prefill (speculative tools)

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def _find(pattern: str, text: str, what: str, tool: str) -> re.Match:
    m = re.search(pattern, text)
    if m is None:
        raise ToolOutputError(f"{tool} printed no '{what}' line (is it the llama.cpp version "
                              "`make anchors` builds?)")
    return m


def parse_completion(stderr: str) -> ToolTiming:
    """llama-completion's perf lines -> timing (see the module docstring)."""
    p = _find(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", stderr, "prompt eval time",
              "llama-completion")
    e = _find(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", stderr, "eval time", "llama-completion")
    s = re.search(r"sampling time =\s*([\d.]+) ms", stderr)
    runs = int(e.group(2))
    sampling = float(s.group(1)) / 1000 if s else 0.0
    return ToolTiming(prompt_tokens=int(p.group(2)), prefill_seconds=float(p.group(1)) / 1000,
                      generated=runs + 1, decode_tokens=runs, passes=runs,
                      decode_seconds=float(e.group(1)) / 1000 + sampling * runs / (runs + 1))


def parse_speculative(stderr: str, tool: str = "llama-lookup") -> ToolTiming:
    """llama-lookup / llama-speculative-simple summary lines -> timing."""
    enc = _find(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr, "encoded", tool)
    dec = _find(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr, "decoded", tool)
    drafted = _find(r"n_drafted\s*=\s*(\d+)", stderr, "n_drafted", tool)
    accepted = _find(r"n_accept\s*=\s*(\d+)", stderr, "n_accept", tool)
    produced, n_acc = int(dec.group(1)), int(accepted.group(1))
    # see the module docstring: where each tool computes its first generated token
    computed = produced if tool == "llama-speculative-simple" else produced - 1
    return ToolTiming(prompt_tokens=int(enc.group(1)), prefill_seconds=float(enc.group(2)),
                      generated=produced, decode_tokens=computed, decode_seconds=float(dec.group(2)),
                      drafted=int(drafted.group(1)), accepted=n_acc, passes=computed - n_acc)


def parse_system_info(stderr: str) -> str | None:
    """The ``system_info: ... | CPU : SSE3 = 1 | ...`` line: the build's features."""
    m = re.search(r"system_info: [^\n]*", stderr)
    return m.group(0) if m else None


def parse(tool: str, stderr: str) -> ToolTiming:
    if tool == "llama-completion":
        return parse_completion(stderr)
    return parse_speculative(stderr, tool)


# --- running -------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolSetup:
    """Everything a tool run shares with the engine it is compared with."""

    bin_dir: Path
    model: Path
    n_ctx: int
    threads: int
    n_ubatch: int = 512
    flash_attn: bool = True
    kv_type: str = "q8_0"
    repack: bool = True
    # True: leave KV type, flash attention and repacking to llama.cpp's defaults (what a user
    # runs); False: pass the three fields above (the engine's configuration, for A/Bs)
    llama_defaults: bool = True
    n_gpu_layers: int = 0
    draft_model: Path | None = None
    timeout_seconds: float = 1800.0


def tool_path(bin_dir: Path, tool: str) -> Path:
    return Path(bin_dir) / tool


def check_built(tools: Sequence[str], bin_dir: Path | None = None) -> Path:
    """The folder holding every named tool, or an error that says how to build them."""
    bin_dir = Path(bin_dir) if bin_dir is not None else anchors_bin_dir()
    missing = [t for t in tools if not os.access(tool_path(bin_dir, t), os.X_OK)]
    if missing:
        raise AnchorsNotBuiltError(
            f"llama.cpp anchor tool(s) {', '.join(missing)} not found in {bin_dir}: run `make "
            f"anchors` (builds them from the llama.cpp llama-cpp-python vendors, ~10 min on 2 "
            f"cores), or point {ENV_VAR} at a folder holding them, or drop --anchor")
    return bin_dir


def command(tool: str, setup: ToolSetup, prompt_file: Path, n_predict: int, *,
            temperature: float = 0.0, seed: int = 0, draft_max: int | None = None) -> list[str]:
    """The tool's argv. The prompt file ends with one extra newline because ``-f`` drops one."""
    cmd = [str(tool_path(setup.bin_dir, tool)), "-m", str(setup.model), "-f", str(prompt_file),
           "-n", str(n_predict), "-c", str(setup.n_ctx), "-b", str(setup.n_ctx),
           "-ub", str(setup.n_ubatch), "-t", str(setup.threads), "-tb", str(setup.threads),
           "--no-escape", "--seed", str(seed), "-ngl", str(setup.n_gpu_layers)]
    if not setup.llama_defaults:
        cmd += ["-fa", "on" if setup.flash_attn else "off", "-ctk", setup.kv_type,
                "-ctv", setup.kv_type]
        if not setup.repack:
            cmd.append("--no-repack")
    if temperature > 0:
        cmd += ["--temp", str(temperature), "--top-k", "0", "--top-p", "1", "--min-p", "0"]
    else:  # greedy: a one-candidate chain, as cheap as our argmax
        cmd += ["--temp", "0", "--top-k", "1"]
    if tool == "llama-completion":
        # plain text in, no chat template of its own, only the generation on stdout
        cmd += ["-no-cnv", "--no-display-prompt"]
    if tool == "llama-speculative-simple":
        if setup.draft_model is None:
            raise EdgespecError("llama-speculative-simple needs the bench's draft model (--draft)")
        # this llama.cpp runs no speculation type unless one is named ("failed to
        # initialize speculative decoding" otherwise)
        cmd += ["-md", str(setup.draft_model), "-td", str(setup.threads), "-ngld", "0",
                "--spec-type", "draft-simple"]
    if draft_max is not None and tool != "llama-completion":
        cmd += ["--spec-draft-n-max", str(draft_max)]
    return cmd


@dataclass(frozen=True)
class ToolAnchor:
    """A loaded llama.cpp anchor: nothing stays in memory between requests."""

    tool: str
    setup: ToolSetup
    draft_max: int | None = None

    def close(self) -> None:
        pass


def setup_from_engine(engine, bin_dir: Path, draft_path: Path | None = None) -> ToolSetup:
    """The engine's own context size, threads and kernel configuration, for its anchors.
    ``draft_path`` (the bench's ``--draft``) stands in where the engine loaded no draft
    model of its own: ``auto`` loads one only where the planner weighs it."""
    cfg = getattr(engine, "config", None)
    kernel = getattr(cfg, "kernel", None)
    draft = getattr(engine, "proposers", {}).get("draft")
    loaded = Path(draft.model.path) if draft is not None and hasattr(draft, "model") else None
    return ToolSetup(
        bin_dir=Path(bin_dir), model=Path(engine.target.path), n_ctx=engine.ctx.n_ctx,
        threads=engine.ctx.n_threads,
        n_ubatch=getattr(kernel, "n_batch", 512), flash_attn=getattr(kernel, "flash_attn", True),
        kv_type=getattr(kernel, "kv_type", "q8_0"), repack=getattr(kernel, "repack", True),
        n_gpu_layers=getattr(cfg, "n_gpu_layers", 0),
        draft_model=loaded or (Path(draft_path) if draft_path is not None else None))


@dataclass(frozen=True)
class ToolRun:
    timing: ToolTiming
    text: str  # what the tool wrote to stdout after the prompt echo (best effort)
    wall_seconds: float
    system_info: str | None


def run_tool(tool: str, setup: ToolSetup, prompt_text: str, n_predict: int, *,
             temperature: float = 0.0, seed: int = 0, draft_max: int | None = None) -> ToolRun:
    """Run one generation; a crash or unreadable output raises with the tool's stderr tail."""
    with tempfile.TemporaryDirectory(prefix="edgespec-anchor-") as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(prompt_text + "\n", encoding="utf-8")
        cmd = command(tool, setup, prompt_file, n_predict, temperature=temperature, seed=seed,
                      draft_max=draft_max)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=setup.timeout_seconds,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise EdgespecError(f"{tool} did not finish within {setup.timeout_seconds:.0f} s") from None
        except OSError as e:
            raise EdgespecError(f"{tool} could not start: {e}") from None
        wall = time.perf_counter() - t0
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise EdgespecError(f"{tool} exited with status {proc.returncode}; stderr ends: "
                            f"{_tail(stderr)}")
    try:
        timing = parse(tool, stderr)
    except ToolOutputError as e:
        raise EdgespecError(f"{e}; stderr ends: {_tail(stderr)}") from None
    stdout = proc.stdout.decode("utf-8", "replace")
    return ToolRun(timing, generated_text(stdout, prompt_text), wall, parse_system_info(stderr))


def generated_text(stdout: str, prompt_text: str) -> str:
    """The lookup tools echo the prompt before the generation; completion does not."""
    body = stdout.lstrip("\n")
    if body.startswith(prompt_text):
        body = body[len(prompt_text):]
    return body.rstrip("\n")


def _tail(text: str) -> str:
    text = text.strip()
    return ("…" + text[-STDERR_TAIL:]) if len(text) > STDERR_TAIL else text
