"""`edgespec self-draft`: measure which layers a self-draft of the target should keep."""
from __future__ import annotations

import json

import click

from .common import handle_errors
from .options import THREADS


@click.command("self-draft")
@click.option("--target", default="qwen-1.5b", show_default=True, help="Registry name or .gguf path.")
@click.option("--layers", "layer_sets", multiple=True,
              help="A candidate layer set (first:N, skip:A-B, 0-5,22-27); repeatable. Default: "
                   "the first and last blocks with the middle skipped, at four depths.")
@click.option("--max-tokens", type=click.IntRange(8, 512), default=64, show_default=True)
@click.option("--threads", type=THREADS, default=None)
@click.option("--agreement-only", is_flag=True,
              help="Measure only how often each draft predicts the target's greedy token "
                   "(independent of machine load; records no choice).")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@handle_errors
def self_draft_command(target, layer_sets, max_tokens, threads, agreement_only, as_json):
    """Build self-drafts of TARGET from subsets of its own layers, run each against the plain
    path on calibration prompts (interleaved, same run), and record the fastest one that
    beats plain as what `--proposer self` uses on this machine. Records nothing as chosen
    when none beats plain, or when the machine was too busy to trust the timing."""
    from ..registry.digests import model_identity  # deferred: `edgespec` starts without what other commands need
    from ..engine.engine import Engine  # deferred: it loads llama.cpp
    from ..calibration.cpu import BUSY_LIMIT, CpuWatch  # deferred: `edgespec` starts without what other commands need
    from ..proposers.self_draft_layers import LayerSet  # deferred: `edgespec` starts without what other commands need
    from ..engine.measure_self import candidates, measure, record  # deferred: `edgespec` starts without what other commands need
    from ..proposers.self_draft_choice import record_path  # deferred: `edgespec` starts without what other commands need

    engine = Engine.load(target, proposer="none", adaptive=True, threads=threads)
    try:
        n = int(engine.target.n_layer)
        sets = [LayerSet.parse(s, n) for s in layer_sets] or candidates(n)
        say = (lambda m: click.echo(f"edgespec: {m}", err=True))
        watch = CpuWatch()  # other processes' CPU share while it ran: is the timing trustworthy?
        trials = measure(engine, sets, max_tokens=max_tokens, say=say, timed=not agreement_only)
        trusted = watch.share() <= BUSY_LIMIT and not agreement_only
        sha = model_identity(engine.target.path)["sha256"]
        rec = record(sha, trials, trusted)
    finally:
        engine.close()
    if as_json:
        click.echo(json.dumps(rec, indent=2))
        return
    click.echo(f"{'layers':<24} {'kept':>4} {'agree':>6} {'accept':>7} {'tok/s':>7} {'plain':>7} "
               f"{'ratio':>6}")
    for t in rec["trials"]:
        click.echo(f"{t['layers']:<24} {t['kept']:>4} {t['agreement']:>6.0%} {t['acceptance']:>7.0%} "
                   f"{t['tok_s']:>7.1f} {t['plain_tok_s']:>7.1f} {t['speedup']:>5.2f}x")
    if agreement_only:
        click.echo("agreement only: nothing timed, nothing recorded as chosen")
    elif not trusted:
        click.echo("the machine was busy: nothing recorded as chosen; run again when it is quiet")
    elif rec["chosen"]:
        click.echo(f"chosen: {rec['chosen']} (recorded in {record_path(sha)}); "
                   "--proposer self uses it on this machine")
    else:
        click.echo("no self-draft beat the plain path here: --proposer self falls back to "
                   "its default layer set, and auto never picks it")
