"""`edgespec models optimize`: a registered copy of a model whose Q6_K tensors are Q8_0.

Why (docs/benchmarks.md, "Why the verify curve bends"): on x86 llama.cpp's CPU backend
repacks Q4_K weights into tiles for a batched gemm but has no repacked kernel for Q6_K, so
a verify pass of n tokens multiplies every Q6_K row n times (one vec_dot per row and
token). Q8_0 batches go through llamafile's tinyBLAS instead, which makes multi-token
passes cheaper relative to a step; the copy is larger (Q8_0 holds 272 bytes per 256
weights, Q6_K 210) and its weights are the source's, requantized.

The copy is written by llama.cpp's own ``llama-quantize`` (`make anchors` builds it beside
the anchors, edgespec.paths.anchors_bin_dir) with every weight tensor named at its type
(:func:`relayout_types`), then checked (a valid header, the same tensors and shapes, only
the Q6_K ones changed, all to Q8_0), fsynced and renamed into $EDGESPEC_HOME/models, and
recorded in the user registry as a model of its own: its own sha256, and the source's name
(or path) and sha256 with what was changed (``ModelSpec.derived``). A failing quantizer, a
full disk or Ctrl-C leaves neither a file nor an entry. :func:`source_check` tells whether
the source still is the file the copy was made from.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .. import statefile
from ..errors import ModelError
from ..paths import anchors_bin_dir, models_dir
from ..runtime.gguf_header import GGUFInfo, TensorInfo, read_gguf_header
from . import user
from .pull import resolve
from .spec import Derivation, ModelSpec, Registry, check_name, load_registry, registry_path
from .store import (Progress, _human, _model_lock, _say, check_gguf, is_path_like, sha256_file,
                    spec_file, stamp_matches)

#: enum ggml_type values (ggml.h)
Q6_K = 14
Q8_0 = 8
#: what a copy changes, as recorded in the registry and named in messages
CHANGE = "q6_k->q8_0"
QUANTIZE = "llama-quantize"
#: bytes of 256 weights in each type: the copy's size before it is written
_BYTES_PER_256 = {Q6_K: 210, Q8_0: 272}
#: llama-quantize's file types (its last-but-one argument) a source may carry over; with
#: every tensor named the file type only labels the copy
_FTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L",
           "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0")
#: the proposers a copy inherits pairs for (a bridge pair is pinned to its target's name)
_INHERITED = ("draft", "ngram", "suffix")


def type_name(ggml_type: int) -> str:
    """llama-quantize's name of a ggml type (it compares names case-insensitively)."""
    import gguf  # deferred: gguf only where a copy is made

    try:
        return gguf.GGMLQuantizationType(ggml_type).name.lower()
    except ValueError:
        raise ModelError(f"ggml type {ggml_type} has no name in this gguf package; "
                         "upgrade gguf to re-lay this model") from None


def relayout_types(tensors: Iterable[TensorInfo], src_type: int = Q6_K,
                   dst: str = "q8_0") -> list[str]:
    """llama-quantize ``--tensor-type`` lines naming EVERY matrix exactly (anchored regexes),
    each at its own type except ``src_type`` ones at ``dst``: with every tensor named, the
    quantizer's mixture logic never runs, and a tensor whose type is unchanged is copied
    byte for byte (llama-quant.cpp: ``quantize = cur_type != new_type``). One-dimensional
    tensors (norms, biases) are never quantized and need no line.

        blk.0.attn_v.weight Q6_K [1536, 256]  ->  ^blk\\.0\\.attn_v\\.weight$=q8_0
        blk.1.ffn_up.weight Q4_K [1536, 8960] ->  ^blk\\.1\\.ffn_up\\.weight$=q4_k
    """
    lines = []
    for t in tensors:
        if len(t.shape) < 2:
            continue
        kind = dst if t.ggml_type == src_type else type_name(t.ggml_type)
        lines.append("^" + re.escape(t.name) + "$=" + kind)
    return lines


def q6_k_tensors(info: GGUFInfo) -> list[TensorInfo]:
    return [t for t in info.tensors if t.ggml_type == Q6_K]


def copy_size(info: GGUFInfo) -> int:
    """The copy's size: the source's, with each Q6_K tensor's bytes at Q8_0's."""
    grow = sum(t.nbytes * _BYTES_PER_256[Q8_0] // _BYTES_PER_256[Q6_K] - t.nbytes
               for t in q6_k_tensors(info))
    return info.file_size + grow


def default_name(source: str) -> str:
    """``qwen-1.5b`` -> ``qwen-1.5b-q8``; a path's file name, lowercased, likewise."""
    base = source if not is_path_like(source) else Path(source).name.removesuffix(".gguf")
    base = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._")
    return f"{base}-q8"


def find_quantize(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else llama-quantize beside the anchors, else on PATH; ModelError saying
    how to get it."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ModelError(f"--quantize {path}: not an executable file; give the path of "
                             f"llama.cpp's {QUANTIZE}")
        return path
    built = anchors_bin_dir() / QUANTIZE
    if built.is_file() and os.access(built, os.X_OK):
        return built
    found = shutil.which(QUANTIZE)
    if found:
        return Path(found)
    raise ModelError(f"{QUANTIZE} not found in {built.parent} nor on PATH: `make anchors` builds "
                     "it from the llama.cpp edgespec links (or pass --quantize PATH)")


@dataclass(frozen=True)
class Optimized:
    """A copy made: its registry entry, and what was changed."""
    spec: ModelSpec
    source: str            # the registry name or absolute path it was made from
    source_path: Path
    changed: tuple[str, ...]  # the tensors re-laid (Q6_K -> Q8_0)
    size_before: int
    size_after: int
    replaced: bool         # an earlier copy of the same name was remade (--force)
    pairs: tuple[str, ...]  # the proposers registered for it, as the source's


def optimize(source: str | os.PathLike[str], *, name: str | None = None,
             quantize: str | os.PathLike[str] | None = None, threads: int | None = None,
             force: bool = False, progress: Progress | None = None) -> Optimized:
    """Make and register the Q8_0 re-layout of ``source`` (a registry name or a .gguf path)
    as model ``name`` (default :func:`default_name`); see the module docstring.

    ModelError, with nothing written, for a source without Q6_K tensors, a taken name (a
    copy made before is remade only with ``force``), a missing or failing quantizer, too
    little free space, or a copy that does not check out."""
    say = progress or _say
    src_text = str(source)
    shipped = Registry.load(registry_path())
    reg = load_registry()
    src_spec: ModelSpec | None = None
    if is_path_like(source):
        src_path = Path(source).expanduser().resolve()
        info = check_gguf(src_path)
        src_label = str(src_path)
    else:
        src_spec = reg.get(src_text)
        src_path = resolve(src_text, pull=True, progress=say)  # its digest checked
        info = check_gguf(src_path)
        src_label = src_text
    changed = q6_k_tensors(info)
    if not changed:
        kinds = sorted({type_name(t.ggml_type).upper() for t in info.tensors if len(t.shape) > 1})
        raise ModelError(f"{src_label}: nothing to re-lay, it has no Q6_K tensors (its "
                         f"matrices are {', '.join(kinds) or 'none'})")
    new = name or default_name(src_text)
    bad = check_name(new)
    if bad:
        raise ModelError(f"{new!r}: {bad}; choose another with --name")
    if new in shipped.models:
        raise ModelError(f"{new!r} is a shipped model; choose another name with --name")
    old = reg.models.get(new)
    if old is not None and (old.derived is None or not force):
        raise ModelError(f"{new!r} is already registered" + (
            f" (made from {old.derived.source}); --force makes it again" if old.derived else
            ", and not as a copy `models optimize` made; choose another name with --name"))
    tool = find_quantize(quantize)
    dest = models_dir() / f"{new}.gguf"
    need = copy_size(info)
    _check_space(dest.parent, need)
    if src_spec is not None:
        src_sha = src_spec.sha256
    else:
        say(f"hashing {src_path} ({_human(info.file_size)}), to record what the copy is made of")
        src_sha = sha256_file(src_path)
    with _model_lock(new, say):
        statefile.clean_temps(dest.parent)
        spec = _make(tool, src_path, info, dest, threads, say, lambda sha: user.add(
            new, dest, role=src_spec.role if src_spec else "target",
            tokenizer=src_spec.tokenizer if src_spec else None, progress=say, sha256=sha,
            description=(f"{src_spec.description if src_spec else src_path.name} "
                         "with its Q6_K tensors as Q8_0"),
            derived=Derivation(source=src_label, sha256=src_sha, change=CHANGE),
            replace=force))
    pairs = []
    if src_spec is not None:
        for p in reg.pairs_for(src_text):
            if p.proposer in _INHERITED and p.draft != new:
                user.add_pair(new, p.proposer, p.draft)
                pairs.append(p.key)
    return Optimized(spec=spec, source=src_label, source_path=src_path,
                     changed=tuple(t.name for t in changed), size_before=info.file_size,
                     size_after=spec.size, replaced=old is not None, pairs=tuple(pairs))


def _check_space(folder: Path, need: int) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
    except OSError as e:
        raise ModelError(statefile.explain(e, folder, "models folder")) from None
    if free < need:
        raise ModelError(f"the copy needs about {_human(need)} in {folder} and "
                         f"{_human(free)} are free; free some space (or set EDGESPEC_HOME to "
                         "a disk with room) and try again")


def _make(tool: Path, src: Path, info: GGUFInfo, dest: Path, threads: int | None,
          say: Progress, register: Callable[[str], ModelSpec]) -> ModelSpec:
    """Quantize into a temporary file beside ``dest``, check it, rename it into place and
    ``register(sha256)`` it; on any failure (Ctrl-C included) nothing is left behind."""
    tmp = statefile.temp_path(dest)
    types = statefile.temp_path(dest.with_name(dest.name + ".types"))
    placed = False
    try:
        try:
            types.write_text("\n".join(relayout_types(info.tensors)) + "\n")
        except OSError as e:
            raise ModelError(statefile.explain(e, types, "tensor type list")) from None
        cmd = [str(tool), "--allow-requantize", "--tensor-type-file", str(types), str(src),
               str(tmp), _ftype(info), str(threads or os.cpu_count() or 1)]
        n = len(q6_k_tensors(info))
        say(f"re-laying {n} Q6_K tensor{'s' if n != 1 else ''} of {src.name} as Q8_0 with "
            f"{tool.name} (a minute or two for a 1.5B model)")
        _run(cmd)
        after = read_gguf_header(tmp, fix="the quantizer wrote a broken file; nothing was kept")
        check_copy(info, after)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        say(f"hashing the copy ({_human(after.file_size)})")
        sha = sha256_file(tmp)
        os.replace(tmp, dest)
        placed = True
        statefile._fsync_dir(dest.parent)
        return register(sha)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if placed:
            with contextlib.suppress(OSError):
                dest.unlink()
        raise
    finally:
        with contextlib.suppress(OSError):
            types.unlink()


def _ftype(info: GGUFInfo) -> str:
    file_type = info.metadata.get("general.file_type")
    if isinstance(file_type, int):
        import gguf  # deferred: as type_name

        with contextlib.suppress(ValueError):
            label = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
            if label in _FTYPES:
                return label
    return "Q8_0"


def _run(cmd: Sequence[str]) -> None:
    """Run the quantizer, its output kept for the error message; Ctrl-C stops it first."""
    with tempfile.TemporaryFile() as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        except OSError as e:
            raise ModelError(f"cannot run {cmd[0]}: {e.strerror or e}") from None
        try:
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if code != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-6:]
            raise ModelError(f"{Path(cmd[0]).name} failed (exit {code}); nothing was kept. "
                             "Its last lines:\n  " + "\n  ".join(tail or ["(no output)"]))


def check_copy(before: GGUFInfo, after: GGUFInfo) -> None:
    """ModelError unless ``after`` holds exactly ``before``'s tensors with their shapes, each
    Q6_K one now Q8_0 and every other at its type."""
    where = f"the quantizer's output {after.path.name}"
    b = {t.name: t for t in before.tensors}
    a = {t.name: t for t in after.tensors}
    if a.keys() != b.keys():
        missing, extra = sorted(b.keys() - a.keys()), sorted(a.keys() - b.keys())
        raise ModelError(f"{where} does not hold the source's tensors (missing "
                         f"{missing[:3] or 'none'}, extra {extra[:3] or 'none'}); nothing was kept")
    for n, t in b.items():
        want = Q8_0 if t.ggml_type == Q6_K else t.ggml_type
        if a[n].shape != t.shape:
            raise ModelError(f"{where}: {n} has shape {list(a[n].shape)}, the source "
                             f"{list(t.shape)}; nothing was kept")
        if a[n].ggml_type != want:
            raise ModelError(f"{where}: {n} is {type_name(a[n].ggml_type).upper()}, expected "
                             f"{type_name(want).upper()}; nothing was kept")


@dataclass(frozen=True)
class SourceCheck:
    """Whether a copy's source still is the file it was made from."""
    stale: bool
    message: str


def source_check(spec: ModelSpec, progress: Progress | None = None, hash_: bool = True
                 ) -> SourceCheck | None:
    """For a copy made by :func:`optimize`: is its source unchanged? None for another model.

    A registered source re-pinned to another digest is stale without reading a byte; else
    the source file is hashed (skipped when its digest stamp says it is unchanged), unless
    ``hash_`` is False (listings): then only the registry is compared."""
    d = spec.derived
    if d is None:
        return None
    remake = f"`edgespec models optimize {d.source} --name {spec.name} --force` makes it again"
    if is_path_like(d.source):
        path = Path(d.source)
    else:
        try:
            src = load_registry().get(d.source)
        except ModelError:
            return SourceCheck(True, f"{spec.name} was made from {d.source}, which is no longer "
                                     f"registered; `edgespec models remove {spec.name}` if you "
                                     "do not need it")
        if src.sha256 != d.sha256:
            return SourceCheck(True, f"stale: {spec.name} was made from {d.source} with sha256 "
                                     f"{d.sha256[:12]}..., which is now pinned to "
                                     f"{src.sha256[:12]}...; {remake}")
        path = spec_file(src)
    if not path.is_file():
        return SourceCheck(False, f"made from {d.source} ({d.change}); its file {path} is not "
                                  "on disk, so it was not compared")
    if not hash_ or stamp_matches(path, d.sha256):
        return SourceCheck(False, f"made from {d.source} ({d.change})")
    (progress or _say)(f"hashing {path}, the source of {spec.name}")
    sha = sha256_file(path)
    if sha != d.sha256:
        return SourceCheck(True, f"stale: {spec.name} was made from {path} with sha256 "
                                 f"{d.sha256[:12]}..., and that file now has "
                                 f"{sha[:12]}...; {remake}")
    return SourceCheck(False, f"made from {d.source} ({d.change}), which is unchanged")


def copies_of(source: str, sha256: str | None) -> list[ModelSpec]:
    """The registered copies made from ``source`` (a registry name or a path) as it is now
    (the digest it was made from is ``sha256``), whose files are on disk."""
    try:
        models = load_registry().models.values()
    except ModelError:
        return []
    return [m for m in models if m.derived is not None and m.derived.source == source
            and (sha256 is None or m.derived.sha256 == sha256) and spec_file(m).is_file()]
