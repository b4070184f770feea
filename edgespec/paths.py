"""Where edgespec keeps its files: one answer for every module.

    $EDGESPEC_HOME/                 default: the platform's user cache dir (platformdirs),
      models/                       e.g. ~/.cache/edgespec on Linux, ~/Library/Caches/edgespec
      calibration/                  on macOS; XDG_CACHE_HOME is honoured on Linux
      ngram/                        persisted n-gram statistics of past generations
      sessions/                     saved conversations (KV state + messages), edgespec chat
      qualification.json
      models.toml                   your own models (`edgespec models add`), layered over the
                                    registry that ships with the package
      anchors/<v>/bin/              llama.cpp's own tools (`make anchors`; $EDGESPEC_ANCHORS
                                    instead when set): the lab's anchors, and llama-quantize
                                    for `edgespec models optimize`
"""
from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
import platformdirs

#: a folder holding llama.cpp's tools instead of $EDGESPEC_HOME/anchors/<v>/bin
ANCHORS_ENV = "EDGESPEC_ANCHORS"


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


def llama_cpp_python_version() -> str:
    """The installed llama-cpp-python's version, from its metadata (llama_cpp not imported)."""
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


def anchors_root(version: str | None = None) -> Path:
    """The per-version folder of llama.cpp's own tools (sources, build tree, bin/): <v> is
    the installed llama-cpp-python's version, so the tools match the llama.cpp the engine
    links (a new pin builds a new folder)."""
    return edgespec_home() / "anchors" / (version or llama_cpp_python_version())


def anchors_bin_dir() -> Path:
    """Where `make anchors` puts llama.cpp's tools: $EDGESPEC_ANCHORS, else anchors_root()/bin."""
    env = os.environ.get(ANCHORS_ENV)
    if env:
        return Path(env).expanduser()
    return anchors_root() / "bin"
