"""The engine: what loads a configuration and serves requests.

    engine.py         Engine: from_config, stream() / generate() / cancel(), over its parts:
    build.py          what from_config loads, over an ExitStack, settled before the engine exists
    proposer_set.py   the loaded proposers (add, remove, clone)
    upkeep.py         what it measures once and keeps: calibration, exact cap, identity
    requests.py       a request before and around the loop: Prepared, its controller, Result
    measure_self.py   which layers a self-draft keeps, measured in a loaded engine

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
