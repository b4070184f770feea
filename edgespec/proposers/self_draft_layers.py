"""Self-speculation's draft: a GGUF file that keeps a subset of the target's layers.

The draft shares the target's embedding, final norm and output head (so its vocabulary is
the target's, id for id) and runs only the kept transformer blocks, renumbered from 0 (as
in SWIFT / LayerSkip-style layer skipping, without training). It is written with the
``gguf`` package from the target file itself: no second model to download.

    LayerSet.parse("first:14", 28)        # blocks 0..13
    LayerSet.parse("skip:8-19", 28)       # every block but 8..19
    LayerSet.parse("0-5,22-27", 28)       # an explicit list
    write_subset(target.gguf, out.gguf, layers)

Files are written beside their final name as a unique ``.part`` and renamed into place, so a
reader never sees half a draft.
"""
from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import InvalidInputError, ModelError

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class LayerSet:
    """The target blocks a self-draft keeps, ascending."""

    layers: tuple[int, ...]
    n_layer: int  # the target's block count

    @staticmethod
    def parse(text: str, n_layer: int) -> "LayerSet":
        text = text.strip().replace(" ", "")
        if not text:
            raise InvalidInputError("an empty layer set; use first:N, skip:A-B or a list "
                                    "such as 0-5,22-27")
        kind, sep, rest = text.partition(":")
        if sep and kind == "first":
            n = _int(rest, text)
            return LayerSet.of(range(n), n_layer, text)
        if sep and kind == "skip":
            drop = set(_ranges(rest, text))
            return LayerSet.of([i for i in range(n_layer) if i not in drop], n_layer, text,
                               listed=drop)
        if sep:
            raise InvalidInputError(f"layer set {text!r}: unknown form {kind!r}; use first:N, "
                                    "skip:A-B or a list such as 0-5,22-27")
        return LayerSet.of(_ranges(text, text), n_layer, text)

    @staticmethod
    def of(layers: Iterable[int], n_layer: int, text: str = "",
           listed: Iterable[int] | None = None) -> "LayerSet":
        kept = sorted(set(int(i) for i in layers))
        bad = [i for i in (listed if listed is not None else kept) if not 0 <= i < n_layer]
        if bad:
            raise InvalidInputError(f"layer set {text or kept!r}: layer {bad[0]} is out of "
                                    f"range; the target has layers 0..{n_layer - 1}")
        if not kept:
            raise InvalidInputError(f"layer set {text!r} keeps no layer")
        if len(kept) == n_layer:
            raise InvalidInputError(f"layer set {text!r} keeps all {n_layer} layers: that is "
                                    "the target itself, not a draft")
        return LayerSet(tuple(kept), n_layer)

    @property
    def key(self) -> str:
        """A short stable name: runs of kept layers, e.g. ``0-5.22-27``."""
        runs, start = [], self.layers[0]
        prev = start
        for i in self.layers[1:] + (None,):
            if i is not None and i == prev + 1:
                prev = i
                continue
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            if i is not None:
                start = prev = i
        return ".".join(runs)

    @property
    def fraction(self) -> float:
        return len(self.layers) / self.n_layer


def _int(s: str, text: str) -> int:
    if not s.isdigit():
        raise InvalidInputError(f"layer set {text!r}: {s!r} is not a layer count")
    return int(s)


def _ranges(s: str, text: str) -> list[int]:
    out: list[int] = []
    for part in s.replace(".", ",").split(","):  # a key (0-5.22-27) reads back as a list
        a, dash, b = part.partition("-")
        if not a.isdigit() or (dash and not b.isdigit()):
            raise InvalidInputError(f"layer set {text!r}: {part!r} is not a layer or a range "
                                    "A-B")
        lo, hi = int(a), int(b) if dash else int(a)
        if hi < lo:
            raise InvalidInputError(f"layer set {text!r}: range {part!r} runs backwards")
        out.extend(range(lo, hi + 1))
    return out


def block_count(path: str | os.PathLike[str]) -> int:
    """The target's transformer block count, from its GGUF header."""
    # deferred: gguf only where a self-draft is written
    import gguf
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    field = reader.fields.get(f"{arch}.block_count")
    if field is None:
        raise ModelError(f"{Path(path).name} has no {arch}.block_count: not a layered model")
    return int(field.contents())


def write_subset(src: str | os.PathLike[str], dst: str | os.PathLike[str], layers: LayerSet) -> Path:
    """Write the self-draft of ``src`` keeping ``layers`` to ``dst`` (atomically)."""
    # deferred: gguf only where a self-draft is written
    import gguf
    src, dst = Path(src), Path(dst)
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    n_layer = int(reader.fields[f"{arch}.block_count"].contents())
    if n_layer != layers.n_layer:
        raise InvalidInputError(f"layer set for {layers.n_layer} layers, but {src.name} has "
                                f"{n_layer}")
    renumber = {old: new for new, old in enumerate(layers.layers)}
    dst.parent.mkdir(parents=True, exist_ok=True)
    # a unique part per writer: two processes building the same draft each rename a whole file
    fd, name = tempfile.mkstemp(prefix=dst.name + ".", suffix=".part", dir=dst.parent)
    os.close(fd)
    part = Path(name)
    w = gguf.GGUFWriter(str(part), arch)
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            vtype = field.types[0]
            sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = len(layers.layers) if key == f"{arch}.block_count" else field.contents()
            w.add_key_value(key, value, vtype, sub_type=sub)
        w.add_string("edgespec.self_draft.layers", layers.key)
        for t in reader.tensors:
            m = _BLOCK.match(t.name)
            if m is None:
                name = t.name
            elif int(m.group(1)) in renumber:
                name = f"blk.{renumber[int(m.group(1))]}.{m.group(2)}"
            else:
                continue
            w.add_tensor(name, t.data, raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(part, dst)
    except BaseException:
        w.close()
        part.unlink(missing_ok=True)
        raise
    return dst


def subset_layers(path: str | os.PathLike[str]) -> str | None:
    """The layer-set key a self-draft file was written with (None for any other GGUF)."""
    # deferred: gguf only where a self-draft is written
    import gguf
    field = gguf.GGUFReader(str(path)).fields.get("edgespec.self_draft.layers")
    return None if field is None else str(field.contents())


def spread(n_layer: int, keep: int) -> Sequence[int]:
    """``keep`` layers: the first and last blocks always, the middle skipped (the layers
    whose removal changes the hidden state least in SWIFT's and LayerSkip's measurements)."""
    head = (keep + 1) // 2
    return [*range(head), *range(n_layer - (keep - head), n_layer)]
