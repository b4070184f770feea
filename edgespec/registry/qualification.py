"""Qualification results of target-proposer pairs, measured per machine (`edgespec qualify`),
keyed by the sha256 of the model files they were measured on.

Any model qualifies, not only the shipped ones: a registry name (shipped or your own), a
``.gguf`` path, a store reference (``ollama:NAME:TAG``) or a Hub reference. A pair is
the registered one when the registry lists it, else any target with ``ngram`` or
``suffix``, or with ``draft:MODEL`` / ``bridge:MODEL`` for any draft model (its tokenizer is
checked when the engine loads it).

They are kept out of models.toml: ``$EDGESPEC_HOME/qualification.json``, beside your own
registry (edgespec.registry.user), holds this machine's, under
``by_digest[target sha256][proposer]`` where the proposer of a draft pair is
``draft:<draft sha256>``; each record names the models it was measured on (``target``,
``draft``) and pins their digests. A record is found by the digests of the files a pair
resolves to now, whatever the models are called; when a name (or path) now resolves to
another file, its old records are left out and reported stale (:func:`stale_qualification`).
``qualification.json`` next to models.toml may hold reference results, keyed by name and
digest-pinned (``results[target][proposer]``, as older edgespec wrote this machine's
too); results keyed by digest win slice by slice.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from .. import statefile
from ..errors import EdgespecError, ModelError
from ..paths import edgespec_home
from .spec import PROPOSER_KINDS, SCHEMA, PairSpec, Registry, load_registry, registry_path
from .store import _atomic_write_text, _model_lock, _say, is_path_like
from . import digests

_DRAFTED = ("draft", "bridge")  # proposers that draft with a model of their own


def qualification_paths() -> tuple[Path, Path]:
    """(reference results next to models.toml, this machine's results); later wins."""
    return (registry_path().with_name("qualification.json"),
            edgespec_home() / "qualification.json")


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: unreadable qualification results ({e}); delete the file "
                         "and re-run `edgespec qualify`") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not all(
            isinstance(data.get(k, {}), dict) for k in ("results", "by_digest")):
        raise ModelError(f"{path}: not a schema-{SCHEMA} qualification file; delete it and "
                         "re-run `edgespec qualify`")
    return data


# --------------------------------------------------------------------------- pairs


def qualification_pair(target: str, proposer: str, reg: Registry | None = None) -> PairSpec:
    """The pair `edgespec qualify TARGET PROPOSER` measures: the registered one when the
    registry lists it, else one made up for any model ("ngram", "suffix", "draft:MODEL",
    "bridge:MODEL", or a draft model's name or path). MODEL and TARGET may be registry
    names, .gguf paths or references; ModelError when a name is unknown."""
    reg = reg or load_registry()
    target = str(target)
    if target in reg.models:
        try:
            return reg.pair(target, proposer)
        except ModelError:
            pass  # not registered: made up below, or refused saying how to name it
    elif not is_path_like(target) and ":" not in target and not Path(target).exists():
        reg.get(target)  # raises: unknown name, listing the known ones
    kind, _, draft = proposer.partition(":")
    if kind in _DRAFTED and draft:
        pass
    elif kind in PROPOSER_KINDS and kind not in _DRAFTED and not draft:
        pass
    elif kind in _DRAFTED:
        raise ModelError(f"{target} has no registered {kind} pair; name the draft model: "
                         f"{kind}:MODEL (a registry name, a .gguf path or a reference)")
    elif proposer in reg.models or is_path_like(proposer):
        kind, draft = "draft", proposer
    else:
        raise ModelError(f"unknown proposer {proposer!r}; give ngram, suffix, draft:MODEL or "
                         "bridge:MODEL (MODEL: a registry name, a .gguf path or a reference)")
    if draft and not (draft in reg.models or is_path_like(draft) or ":" in draft
                      or Path(draft).exists()):
        reg.get(draft)  # raises: unknown name
    return PairSpec(target=target, proposer=kind, draft=draft or None)


def model_digest(name_or_path: str, reg: Registry | None = None) -> str:
    """The sha256 of the file `name_or_path` names: a registry model's pin (nothing is
    hashed), else the file it resolves to, hashed once and cached while it is unchanged.
    ModelError when it cannot be resolved without pulling."""
    reg = reg or load_registry()
    key = str(name_or_path)
    if key in reg.models and not is_path_like(key):
        return reg.models[key].sha256
    # deferred: pull imports the Hub and store modules, needed only for paths
    from .pull import resolve
    path = resolve(key, pull=False)
    try:
        return digests.model_identity(path)["sha256"]
    except EdgespecError as e:
        raise ModelError(str(e)) from None


def _digest_key(pair: PairSpec, draft_sha: str | None) -> str:
    return f"{pair.proposer}:{draft_sha}" if draft_sha else pair.proposer


def _pins(pair: PairSpec, reg: Registry) -> dict[str, str]:
    pins = {"target_sha256": model_digest(pair.target, reg)}
    if pair.draft:
        pins["draft_sha256"] = model_digest(pair.draft, reg)
    return pins


# --------------------------------------------------------------------------- lookups


def qualification(target: str, proposer: str) -> dict[str, dict]:
    """Qualification results of a pair: {slice: record}, {} if never qualified.

    `target` is any model (see the module docstring); `proposer` is as for
    :func:`qualification_pair` ("ngram", "draft:qwen-0.5b", "qwen-0.5b", "draft" for a
    target's one registered draft pair). Only records measured on the files the pair
    resolves to now are returned."""
    reg = load_registry()
    pair = qualification_pair(target, proposer, reg)
    pins = _pins(pair, reg)
    key = _digest_key(pair, pins.get("draft_sha256"))
    merged: dict[str, dict] = {}
    for path in qualification_paths():
        data = _read(path)
        # older, name-keyed results (registered pairs), pinned to digests
        named = data.get("results", {}).get(pair.target, {})
        slices = named.get(pair.key, {}) if isinstance(named, dict) else {}
        for name, record in slices.items() if isinstance(slices, dict) else ():
            if isinstance(record, dict) and all(record.get(k) == v for k, v in pins.items()):
                merged.setdefault(name, dict(record))
        by_digest = data.get("by_digest", {}).get(pins["target_sha256"], {})
        slices = by_digest.get(key, {}) if isinstance(by_digest, dict) else {}
        for name, record in slices.items() if isinstance(slices, dict) else ():
            if isinstance(record, dict):
                merged[name] = dict(record)
    return merged


def stale_qualification(target: str, proposer: str) -> dict[str, dict]:
    """Records of this pair, by its names, measured on files it no longer resolves to:
    {slice: record} (each record names the digests it was measured on). {} when the pair
    cannot be resolved now (a file missing), as nothing can be compared."""
    reg = load_registry()
    try:
        pair = qualification_pair(target, proposer, reg)
        pins = _pins(pair, reg)
    except ModelError:
        return {}
    stale: dict[str, dict] = {}
    data = _read(qualification_paths()[1])
    for tsha, by_key in data.get("by_digest", {}).items():
        for slices in by_key.values() if isinstance(by_key, dict) else ():
            for name, r in slices.items() if isinstance(slices, dict) else ():
                if not isinstance(r, dict) or r.get("target") != pair.target \
                        or r.get("proposer") != pair.proposer or r.get("draft") != pair.draft:
                    continue
                if tsha != pins["target_sha256"] or r.get("draft_sha256") != pins.get(
                        "draft_sha256"):
                    stale[name] = dict(r)
    return stale


def record_qualification(target: str, proposer: str, slices: Mapping[str, Mapping]) -> Path:
    """Store {slice: record} for a pair (any model, see :func:`qualification_pair`) in
    $EDGESPEC_HOME/qualification.json under the digests of its files, replacing those
    slices; each record names the pair's models and pins their digests."""
    reg = load_registry()
    pair = qualification_pair(target, proposer, reg)
    pins = _pins(pair, reg)
    key = _digest_key(pair, pins.get("draft_sha256"))
    labels = {"target": pair.target, "proposer": pair.proposer, "draft": pair.draft}
    path = qualification_paths()[1]
    with _model_lock("qualification", _say):
        data = _read(path) or {"schema": SCHEMA}
        entry = data.setdefault("by_digest", {}).setdefault(pins["target_sha256"], {}) \
            .setdefault(key, {})
        for name, record in slices.items():
            entry[str(name)] = {**dict(record), **labels, **pins}
        data.setdefault("schema", SCHEMA)
        statefile.clean_temps(path.parent)  # what killed writers left
        _atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True),
                           what="qualification results")
    return path
