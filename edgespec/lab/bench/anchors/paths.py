"""Where the llama.cpp anchor tools live: one answer for `make anchors` and the bench.

    $EDGESPEC_ANCHORS                      if set: the folder holding the binaries
    $EDGESPEC_HOME/anchors/<v>/bin         otherwise; <v> is the installed llama-cpp-python's
                                           version, so the tools always match the llama.cpp the
                                           engine links (a new pin builds a new folder)

Importing this module never imports llama_cpp (the version comes from the package metadata).
"""
from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from ....paths import edgespec_home

# The llama.cpp programs `make anchors` builds, by CMake target (= binary name).
TOOL_TARGETS = ("llama-completion", "llama-lookup", "llama-speculative-simple", "llama-server", "ggml-rpc-server")
ENV_VAR = "EDGESPEC_ANCHORS"


def llama_cpp_python_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


def anchors_root(version: str | None = None) -> Path:
    """The per-version folder (sources, build tree, bin/) under $EDGESPEC_HOME."""
    return edgespec_home() / "anchors" / (version or llama_cpp_python_version())


def anchors_bin_dir() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return anchors_root() / "bin"
