"""Qualification results of target-proposer pairs, measured per machine (`edgespec qualify`).

They are kept out of models.toml: ``qualification.json`` next to models.toml holds
reference results (optional), and ``$EDGESPEC_HOME/qualification.json`` the local ones,
which win slice by slice. Each record pins the sha256 of the models it was measured on;
a record whose digests no longer match the registry is ignored as stale.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from ..errors import ModelError
from ..paths import edgespec_home
from .spec import SCHEMA, PairSpec, Registry, load_registry, registry_path
from .store import _atomic_write_text, _model_lock, _say


def qualification_paths() -> tuple[Path, Path]:
    """(reference results next to models.toml, this machine's results); later wins."""
    return (registry_path().with_name("qualification.json"),
            edgespec_home() / "qualification.json")


def _read_qualification(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: unreadable qualification results ({e}); delete the file "
                         "and re-run `edgespec qualify`") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(
            data.get("results", {}), dict):
        raise ModelError(f"{path}: not a schema-{SCHEMA} qualification file; delete it and "
                         "re-run `edgespec qualify`")
    return data.get("results", {})


def _pins(reg: Registry, pair: PairSpec) -> dict[str, str]:
    pins = {"target_sha256": reg.get(pair.target).sha256}
    if pair.draft:
        pins["draft_sha256"] = reg.get(pair.draft).sha256
    return pins


def qualification(target: str, proposer: str) -> dict[str, dict]:
    """Qualification results of a registered pair: {slice: record}, {} if never qualified.

    `proposer` is as for Registry.pair ("ngram", "suffix", "draft:qwen-0.5b",
    "qwen-0.5b", "draft"). Records measured on other model files (pinned
    digests differ from the registry) are left out.
    """
    reg = load_registry()
    pair = reg.pair(target, proposer)
    pins = _pins(reg, pair)
    merged: dict[str, dict] = {}
    for path in qualification_paths():
        slices = _read_qualification(path).get(pair.target, {}).get(pair.key, {})
        for name, record in slices.items() if isinstance(slices, dict) else ():
            if isinstance(record, dict) and all(record.get(k) == v for k, v in pins.items()):
                merged[name] = dict(record)
    return merged


def record_qualification(target: str, proposer: str, slices: Mapping[str, Mapping]) -> Path:
    """Store {slice: record} for a registered pair in $EDGESPEC_HOME/qualification.json,
    replacing those slices; each record is stamped with the digests it was measured on."""
    reg = load_registry()
    pair = reg.pair(target, proposer)
    pins = _pins(reg, pair)
    path = qualification_paths()[1]
    with _model_lock("qualification", _say):
        results = _read_qualification(path)
        entry = results.setdefault(pair.target, {}).setdefault(pair.key, {})
        for name, record in slices.items():
            entry[str(name)] = {**dict(record), **pins}
        _atomic_write_text(path, json.dumps({"schema": SCHEMA, "results": results}, indent=2,
                                            sort_keys=True))
    return path

