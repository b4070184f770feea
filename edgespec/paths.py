"""Where edgespec keeps its files: one answer for every module.

    $EDGESPEC_HOME/                 default: the platform's user cache dir (platformdirs),
      models/                       e.g. ~/.cache/edgespec on Linux, ~/Library/Caches/edgespec
      calibration/                  on macOS; XDG_CACHE_HOME is honoured on Linux
      ngram/                        persisted n-gram statistics of past generations
      sessions/                     saved conversations (KV state + messages), edgespec chat
      qualification.json
      models.toml                   your own models (`edgespec models add`), layered over the
                                    registry that ships with the package
"""
from __future__ import annotations

import os
from pathlib import Path
import platformdirs


def edgespec_home() -> Path:
    """$EDGESPEC_HOME, or the platform's user cache dir for edgespec."""
    env = os.environ.get("EDGESPEC_HOME")
    if env:
        return Path(env).expanduser()

    return Path(platformdirs.user_cache_dir("edgespec", appauthor=False))


def models_dir() -> Path:
    return edgespec_home() / "models"


def calibration_dir() -> Path:
    return edgespec_home() / "calibration"


def ngram_dir() -> Path:
    return edgespec_home() / "ngram"


def sessions_dir() -> Path:
    return edgespec_home() / "sessions"


def user_registry_path() -> Path:
    """The user's registry: models added with `edgespec models add`, same format as the
    shipped models.toml (edgespec.registry.user)."""
    return edgespec_home() / "models.toml"
