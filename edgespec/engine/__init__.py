"""The engine: what it is built from and the Engine itself.

    config.py   EngineConfig: what an engine is built from (validated once)
    engine.py   Engine.from_config (an ExitStack builder), stream() / generate() / cancel()
"""
from .config import EngineConfig

__all__ = ["Engine", "EngineConfig", "Result"]


def __getattr__(name):
    # Deliberately lazy: edgespec.engine.config is read by the CLI, the planner and the TUI,
    # which must not load llama.cpp (edgespec.engine.engine imports the backend) to do so.
    if name in ("Engine", "Result"):
        from . import engine
        return getattr(engine, name)
    raise AttributeError(name)
