"""Textual TUI over edgespec's event stream: `edgespec tui`.

Nothing here imports llama_cpp: the app sees only ``edgespec.api.events`` from an
:class:`~edgespec.tui.source.EventSource` (the real engine, or a scripted replay).
"""
from .app import EdgespecApp, create_app
from .source import Choices, EngineSource, EventSource, ScriptedSource, Settings

__all__ = ["EdgespecApp", "create_app", "Choices", "EngineSource", "EventSource",
           "ScriptedSource", "Settings"]
