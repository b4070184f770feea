"""The planner's I/O: registry names to files and digests, cached calibrations, pulled drafts.

Everything here reads what is on disk; nothing loads weights except an explicit
``measure`` (``edgespec plan --calibrate``).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..runtime.kernel import KernelConfig
from ..errors import ModelError
from .. import proposers, registry
from ..calibration import cache
from ..calibration.curve import Calibration


def resolve_model(name_or_path: str | os.PathLike[str], pull: bool = True) -> tuple[Path, str | None, str | None]:
    """(path, registry name or None, pinned sha256 or None) of a registry name or a .gguf path.

    A registry name is pulled when missing (``pull``); an unknown name is a ModelError
    that lists the known ones (:func:`edgespec.registry.resolve`)."""
    path = registry.resolve(name_or_path, pull=pull)
    key = str(name_or_path)
    if not registry.is_path_like(name_or_path):
        reg = registry.load_registry()
        if key in reg.models:
            return path, key, reg.get(key).sha256
    return path, None, None


def cached_calibration(path: Path, sha256: str | None, n_threads: int | None = None,
                       measure: bool = False, force: bool = False,
                       kernel: KernelConfig | None = None) -> Calibration | None:
    """The calibration cached for this device, kernel configuration and model (CPU layout),
    or None. ``measure`` measures a missing one (``force``: re-measures a cached one too)."""
    if measure or force:
        return cache.load_or_measure(path, n_threads=n_threads, sha256=sha256, force=force,
                                   kernel=kernel)
    return cache.cached(path, n_threads=n_threads, kernel=kernel, sha256=sha256)


def registered_draft(target_name: str) -> str | None:
    """The target's registered draft model, if it is already on disk (planning never pulls
    a draft). None for a target the registry does not know."""
    try:
        pairs = registry.load_registry().pairs_for(target_name)
    except ModelError:  # no registry: a path-only setup has no registered drafts
        return None
    for pair in pairs:
        if proposers.needs_model(pair.proposer) and pair.draft and pair.draft != target_name \
                and registry.model_path(pair.draft).is_file():
            return pair.draft
    return None
