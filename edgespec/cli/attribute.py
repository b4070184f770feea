"""`edgespec attribute BEFORE AFTER`: which part of the setup explains a goodput change."""
from __future__ import annotations

import json

import click

from .common import handle_errors
from ..errors import InvalidInputError


@click.command("attribute")
@click.argument("before", type=click.Path(dir_okay=False))
@click.argument("after", type=click.Path(dir_okay=False))
@click.option("--config", "configs", multiple=True,
              help="Configuration (bench label or proposer) to compare; default: every one "
                   "present in both, the plain path last.")
@click.option("--json", "as_json", is_flag=True, help="Print the attribution as JSON.")
@handle_errors
def attribute_command(before, after, configs, as_json):
    """Compare two sets of records (bench.json from `edgespec bench`, or JSONL of
    `edgespec generate --json` or stats records) and say whether proposer quality,
    verification cost, scheduling, numerical drift or feature incompatibility explains
    the goodput change, with the numbers."""
    from ..lab.analysis.attribute import attribute, compared_configs, load  # deferred: `edgespec` starts without what other commands need

    b, a = load(before), load(after)
    names = list(configs) or compared_configs(b, a)
    if not names:
        raise InvalidInputError(f"{before} and {after} share no configuration; pick one with "
                                "--config")
    results = [attribute(b, a, c) for c in names]
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
        return
    for r in results:
        click.echo("\n".join([r.explanation[0], *("  " + x for x in r.explanation[1:])]))
