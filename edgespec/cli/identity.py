"""`edgespec identity`: the release identity of the engine the same flags would run."""
from __future__ import annotations

import json

import click

from .common import handle_errors
from .options import engine_options


@click.command("identity")
@engine_options
@click.option("--json", "as_json", is_flag=True, help="Print the full record as JSON.")
@handle_errors
def identity_command(flags, as_json):
    """Load the engine generate would run and print its release identity: every component
    its speed and output depend on (models, tokenizers, code, llama.cpp build, kernels,
    threads, policy, features, hardware) and their hash."""
    from ..engine.engine import Engine  # deferred: it loads llama.cpp

    engine = Engine.from_config(flags.config())
    try:
        ident = engine.identity
    finally:
        engine.close()
    if as_json:
        click.echo(json.dumps(ident.to_dict(), indent=2))
    else:
        click.echo(ident.summary())
