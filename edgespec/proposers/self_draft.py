"""Self-speculation (``--proposer self``): the target drafts for itself with a subset of its
own layers (:mod:`.self_draft_layers`), run as an ordinary same-vocabulary draft model.

The draft file is derived from the target, so it is cached, not registered:

    $EDGESPEC_HOME/self-drafts/<target sha256[:16]>-<layer set>.gguf
    $EDGESPEC_HOME/self-drafts/<target sha256[:16]>-<layer set>.json   what it was built from

A cache entry is used only when its record names the same target digest and layer set and
the file still has the recorded size, a readable GGUF header and its layer-set key; a
corrupt, truncated or stale one is rebuilt, with a warning. Which layer set to use is a
measured choice (:mod:`.self_draft_choice`); ``layers=...`` overrides it.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import EdgespecError
from ..paths import edgespec_home
from .draft import DraftModelProposer
from .self_draft_layers import LayerSet, subset_layers, write_subset

if TYPE_CHECKING:
    from ..runtime.model import Model
    from ..runtime.kernel import KernelConfig

Say = Callable[[str], None]
_FORMAT = 1


def self_draft_dir() -> Path:
    return edgespec_home() / "self-drafts"


def cache_paths(target_sha: str, layers: LayerSet) -> tuple[Path, Path]:
    stem = f"{target_sha[:16]}-{layers.key}"
    d = self_draft_dir()
    return d / f"{stem}.gguf", d / f"{stem}.json"


def _say(message: str) -> None:
    print(f"edgespec: {message}", file=sys.stderr, flush=True)


def stale_reason(path: Path, record: Path, target_sha: str, layers: LayerSet) -> str | None:
    """Why a cached self-draft cannot be used (None when it can)."""
    if not path.is_file():
        return "not built yet"
    try:
        meta = json.loads(record.read_text())
    except (OSError, ValueError):
        return f"its record {record.name} is missing or corrupt"
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        return f"its record {record.name} is from another edgespec version"
    if meta.get("target_sha256") != target_sha or meta.get("layers") != layers.key:
        return "it was built from another target or layer set"
    if meta.get("size") != path.stat().st_size:
        return f"{path.name} has {path.stat().st_size} bytes, {meta.get('size')} when built"
    try:
        key = subset_layers(path)
    except Exception as e:  # noqa: BLE001 - any unreadable header means: rebuild
        return f"{path.name} is not a readable GGUF file ({e})"
    if key != layers.key:
        return f"{path.name} holds layers {key}, not {layers.key}"
    return None


def ensure_self_draft(target: Path, target_sha: str, layers: LayerSet,
                      say: Say | None = None) -> Path:
    """The cached self-draft of ``target`` keeping ``layers``, built when missing or stale."""
    say = say or _say
    path, record = cache_paths(target_sha, layers)
    why = stale_reason(path, record, target_sha, layers)
    if why is None:
        return path
    if path.exists() or record.exists():
        say(f"rebuilding the self-draft {path.name}: {why}")
    else:
        say(f"building the self-draft of {target.name} with layers {layers.key} "
            f"({len(layers.layers)} of {layers.n_layer})")
    try:
        write_subset(target, path, layers)
    except OSError as e:
        raise EdgespecError(f"could not write the self-draft {path}: {e}; free some disk space "
                            f"or set EDGESPEC_HOME elsewhere") from None
    fd, tmp = tempfile.mkstemp(prefix=record.name + ".", dir=record.parent)
    with os.fdopen(fd, "w") as f:
        json.dump({"format": _FORMAT, "target": str(target), "target_sha256": target_sha,
                   "layers": layers.key, "size": path.stat().st_size}, f, indent=1)
    os.replace(tmp, record)
    return path


class SelfDraftProposer(DraftModelProposer):
    """A draft model made of the target's own layers; it owns (and closes) that model."""

    name = "self"

    def __init__(self, model: Model, layers: LayerSet, *, n_ctx: int,
                 n_threads: int | None = None, n_batch: int = 0,
                 kernel: KernelConfig | None = None, target_vocab: int | None = None) -> None:
        super().__init__(model, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch,
                         kernel=kernel, target_vocab=target_vocab)
        self.layers = layers

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.model.close()
