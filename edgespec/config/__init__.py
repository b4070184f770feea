"""What an engine is built from, below the planner that completes it and the engine that
loads it (both import it; it imports only the proposers' registry, api, errors and the
runtime's kernel and RPC names).

    engine_config.py   EngineConfig (validated once), split_proposers
"""
from .engine_config import EngineConfig, split_proposers

__all__ = ["EngineConfig", "split_proposers"]
