"""A pytest plugin that runs llama-cpp-python's own test files (from its sdist) against
``edgespec.apps.Llama`` and this machine's models. Loaded by test_upstream_suite.py in a
subprocess (``-p upstream_plugin``); nothing of llama-cpp-python's tests is copied here.

``EDGESPEC_UPSTREAM_TARGET``: ``edgespec`` (``llama_cpp.Llama`` is replaced by
:class:`Upstream`, edgespec's Llama) or ``llama_cpp`` (the real class: the baseline).
Either way the Hub downloads the tests ask for are answered with local registry models
of the same kind; a model with no local stand-in (a recurrent or hybrid architecture)
skips its test, saying so.
"""
from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

#: (repo_id, filename) the tests download -> the registry model standing in for it
STAND_INS = {
    ("lmstudio-community/Qwen3.5-0.8B-GGUF", "Qwen3.5-0.8B-Q8_0.gguf"): "qwen-0.5b",
    ("ggml-org/models", "tinyllamas/stories15M-q4_0.gguf"): "smollm2-135m",
    # a generative model embeds too (mean pooling); no embedding model is in the registry
    ("CompendiumLabs/bge-small-en-v1.5-gguf", "bge-small-en-v1.5-q4_k_m.gguf"): "smollm2-135m",
}
NO_STAND_IN = {
    "QuantFactory/mamba-130m-hf-GGUF": "a recurrent (Mamba) model",
    "tiiuae/Falcon-H1-Tiny-90M-Instruct-GGUF": "a hybrid (Falcon-H1) model",
}


def _hf_hub_download(repo_id, filename, *args, **kwargs):
    from edgespec import registry

    name = STAND_INS.get((repo_id, filename))
    if name is None:
        what = NO_STAND_IN.get(repo_id, f"{repo_id}/{filename}")
        pytest.skip(f"no local stand-in for {what}: the registry has none and the tests "
                    "run offline")
    return str(registry.resolve(name, pull=True))


def _scipy_stand_in() -> None:
    """test_llama.py imports scipy.special.log_softmax (and never calls it); without scipy
    installed, a numpy log_softmax stands in so that the module imports."""
    try:
        import scipy.special  # noqa: F401
        return
    except ImportError:
        pass

    def log_softmax(x, axis=-1):
        x = np.asarray(x, dtype=np.float64)
        m = np.max(x, axis=axis, keepdims=True)
        return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))

    scipy = types.ModuleType("scipy")
    special = types.ModuleType("scipy.special")
    special.log_softmax = log_softmax
    scipy.special = special
    sys.modules.setdefault("scipy", scipy)
    sys.modules.setdefault("scipy.special", special)


def _upstream_class():
    """edgespec's Llama as the suite constructs it: llama-cpp-python's keywords; where they
    leave the kernel configuration to edgespec, exact mode (greedy output bitwise the plain
    path's, so a reused prefix and a fresh prompt agree); given kernel keywords (the suite's
    ``flash_attn=True``), edgespec's default lossless mode on that configuration."""
    from edgespec.apps import Llama

    class Upstream(Llama):
        def __init__(self, model_path, *args, **kwargs):
            kernel = any(k in kwargs for k in ("flash_attn", "type_k", "type_v", "use_mmap"))
            kwargs.setdefault("exact", not kernel)
            super().__init__(model_path, *args, **kwargs)

    Upstream.__name__ = Upstream.__qualname__ = "Llama"
    return Upstream


def pytest_configure(config):
    _scipy_stand_in()
    import huggingface_hub
    import llama_cpp

    huggingface_hub.hf_hub_download = _hf_hub_download
    if os.environ.get("EDGESPEC_UPSTREAM_TARGET", "edgespec") == "edgespec":
        llama_cpp.Llama = _upstream_class()


def pytest_collection_modifyitems(session, config, items):
    # the test modules bound hf_hub_download at import (``from huggingface_hub import``)
    for item in items:
        mod = getattr(item, "module", None)
        if mod is not None and hasattr(mod, "hf_hub_download"):
            mod.hf_hub_download = _hf_hub_download


__all__ = ["NO_STAND_IN", "STAND_INS"]
