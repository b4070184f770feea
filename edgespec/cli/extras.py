"""Commands whose dependencies are optional extras: a clear exit instead of a traceback.

The core install runs the engine, generate, chat, plan and models; `serve`, `tui` and the
bench plots need `pip install 'edgespec[server]'` / `[tui]` / `[bench]`. Each such command
calls require() first, before anything imports the missing package.
"""
from __future__ import annotations

import importlib.util
import sys

import click

#: extra -> the top-level modules it provides (all must be importable)
EXTRAS = {
    "server": ("fastapi", "uvicorn", "sse_starlette", "prometheus_client"),
    "tui": ("textual", "rich"),
    "bench": ("matplotlib",),
}


def missing(extra: str) -> list[str]:
    """The modules of `extra` that are not installed."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require(extra: str, command: str) -> None:
    """Exit 2 with the pip command to run when `extra` is not installed."""
    if missing(extra):
        click.echo(f"edgespec {command} needs the {extra} extra: "
                   f"pip install 'edgespec[{extra}]'", err=True)
        sys.exit(2)
