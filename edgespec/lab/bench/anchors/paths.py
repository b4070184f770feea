"""Where the llama.cpp anchor tools live: one answer for `make anchors` and the bench.

    $EDGESPEC_ANCHORS                      if set: the folder holding the binaries
    $EDGESPEC_HOME/anchors/<v>/bin         otherwise; <v> is the installed llama-cpp-python's
                                           version, so the tools always match the llama.cpp the
                                           engine links (a new pin builds a new folder)

The folders themselves are edgespec.paths' (the product finds llama-quantize there too,
`edgespec models optimize`); this module adds which tools the lab builds.
Importing this module never imports llama_cpp (the version comes from the package metadata).
"""
from __future__ import annotations

from ....paths import ANCHORS_ENV as ENV_VAR
from ....paths import anchors_bin_dir, anchors_root, llama_cpp_python_version

# The llama.cpp programs `make anchors` builds, by CMake target (= binary name); llama-quantize
# is the product's (`edgespec models optimize` re-lays a model's Q6_K tensors with it).
TOOL_TARGETS = ("llama-completion", "llama-lookup", "llama-speculative-simple", "llama-server",
                "ggml-rpc-server", "llama-quantize")

__all__ = ["ENV_VAR", "TOOL_TARGETS", "anchors_bin_dir", "anchors_root",
           "llama_cpp_python_version"]
