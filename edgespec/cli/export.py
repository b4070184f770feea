"""`edgespec export --to vllm|sglang|llama-server [PAIR]`: a qualified pair's speculative
configuration for a distributed engine."""
from __future__ import annotations

import json

import click

from .common import handle_errors


@click.command("export")
@click.option("--to", "engine", type=click.Choice(["vllm", "sglang", "llama-server"]),
              required=True, help="The engine to configure.")
@click.argument("pair", required=False)
@click.option("--num-speculative-tokens", type=int, default=None,
              help="Draft length to write instead of the one the qualification implies.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the JSON document here instead of stdout.")
@click.option("--command", "command_only", is_flag=True, help="Print only the command line.")
@handle_errors
def export_command(engine, pair, num_speculative_tokens, out, command_only):
    """Write PAIR's speculative configuration for ENGINE (PAIR is TARGET:PROPOSER, e.g.
    qwen-1.5b:ngram or qwen-1.5b:draft:qwen-0.5b; the registry's default pair when
    omitted), with the digests and the qualification it rests on."""
    from ..lab.analysis.export import export  # deferred: `edgespec` starts without what other commands need

    target, proposer = (pair.split(":", 1) + [None])[:2] if pair else (None, None)
    doc = export(engine, target, proposer, num_tokens=num_speculative_tokens)
    text = doc["command"] if command_only else json.dumps(doc, indent=2)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        click.echo(f"wrote {out}", err=True)
    else:
        click.echo(text)
