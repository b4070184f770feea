"""edgespec: exact speculative decoding for GGUF models on llama.cpp."""
from .errors import (Cancelled, ContextOverflowError, EdgespecError, IncompatibleDraftError,
                     InvalidInputError, ModelError, UnsupportedError)
from ._version import __version__
from .api.params import GenerationParams, SamplingParams

__all__ = [
    "Cancelled", "ContextOverflowError", "EdgespecError", "IncompatibleDraftError",
    "InvalidInputError", "ModelError", "UnsupportedError", "GenerationParams", "SamplingParams",
    "Engine", "Result", "Llama", "AsyncEngine",
]


def __getattr__(name):
    # Lazy so that `import edgespec` (CLI start-up, TUI, pure unit tests) does not load llama.cpp.
    if name in ("Engine", "Result"):
        from .engine import engine
        return getattr(engine, name)
    if name in ("Llama", "AsyncEngine"):  # llama-cpp-python-shaped and asyncio (edgespec.apps)
        # lazy, as above: the apps pull in llama.cpp
        from . import apps
        return getattr(apps, name)
    raise AttributeError(name)
