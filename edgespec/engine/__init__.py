"""The engine: what loads a configuration and serves requests.

    engine.py   Engine.from_config (an ExitStack builder), stream() / generate() / cancel()

EngineConfig lives below the planner (edgespec.config) and is re-exported here.
"""
from typing import Any

from ..config import EngineConfig

__all__ = ["Engine", "EngineConfig", "Result"]


def __getattr__(name: str) -> Any:
    # Deliberately lazy: `import edgespec.engine` (the CLI, the TUI) must not load llama.cpp
    # (edgespec.engine.engine imports the backend) before an engine is built.
    if name in ("Engine", "Result"):
        from . import engine
        return getattr(engine, name)
    raise AttributeError(name)
