"""Which layers a self-draft keeps: the stored choice, read (no engine runs here).

edgespec.engine.measure_self measures candidate layer sets in a loaded engine and writes
what it found; :func:`chosen_layers` reads it back, and is what ``--proposer self`` uses by
default (:func:`layers_for`, read by the registry's ``self`` factory and the planner): the
fastest candidate, when it beat the plain path.

    $EDGESPEC_HOME/calibration/self-<target sha256[:16]>.json
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInputError
from ..paths import calibration_dir
from .self_draft_layers import LayerSet, spread

#: the stored record's format (edgespec.engine.measure_self writes it)
FORMAT = 1


@dataclass(frozen=True)
class Trial:
    """One candidate layer set as measured (a stored record's ``trials`` entry)."""

    layers: str  # LayerSet.key
    kept: int
    drafted: int
    accepted: int
    tok_s: float  # decode tokens/s with this self-draft (geomean over the prompts; 0: untimed)
    plain_tok_s: float  # the plain path's, interleaved with it
    #: share of the target's greedy tokens the draft predicts given the true prefix: what a
    #: greedy draft's first token is accepted at, independent of machine load
    agreement: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def speedup(self) -> float:
        return self.tok_s / self.plain_tok_s if self.plain_tok_s else 0.0


def record_path(target_sha: str) -> Path:
    return calibration_dir() / f"self-{target_sha[:16]}.json"


def chosen_layers(target_sha: str | None, n_layer: int) -> LayerSet | None:
    """The recorded fastest layer set for this target, if it beat the plain path."""
    if not target_sha:
        return None
    try:
        rec = json.loads(record_path(target_sha).read_text())
        if rec.get("format") != FORMAT or rec.get("chosen") is None:
            return None
        return LayerSet.parse(rec["chosen"], n_layer)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, InvalidInputError):
        return None  # nothing measured (or unreadable): the caller's default applies


def layers_for(target_sha: str | None, n_layer: int, layers_text: str = "") -> LayerSet:
    """The layers a self-draft keeps: ``layers_text`` when given, else the measured choice
    (`edgespec self-draft`), else half the blocks, the first and last kept."""
    if layers_text:
        return LayerSet.parse(layers_text, n_layer)
    return chosen_layers(target_sha, n_layer) or LayerSet.of(spread(n_layer, n_layer // 2), n_layer)
