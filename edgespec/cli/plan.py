"""`edgespec plan`: what would run, where, and why, without generating anything."""
from __future__ import annotations

import json

import click

from .common import handle_errors

_DEVICE_HELP = ("JSON file describing another machine instead of probing this one: "
                '{"ram_available": "16GiB", "gpus": [{"name": "RTX 4060", "free": "7.5GiB", '
                '"total": "8GiB"}], "speed": {"verify_costs": {"2": 1.02, "8": 1.1}, '
                '"draft_step_ratio": 0.15}} (every key optional; see edgespec/device.py).')


@click.command("plan")
@click.option("--target", default="qwen-1.5b", show_default=True, help="Registry name or .gguf path.")
@click.option("--draft", default=None,
              help="Draft model to weigh against the free proposers (default: the target's "
                   "registered draft, if it is already pulled).")
@click.option("--budget", default=None,
              help="Host memory budget, e.g. 4GiB or 512MiB (default: available RAM minus a margin).")
@click.option("--ctx", "n_ctx", type=click.IntRange(64), default=None,
              help="Context size to plan for (default: 4096, reduced if it does not fit).")
@click.option("--kv-type", type=click.Choice(["f16", "q8_0", "q4_0"]), default=None,
              help="Force the KV cache type (default: f16 unless it does not fit).")
@click.option("--device-json", type=click.Path(exists=True, dir_okay=False), default=None,
              help=_DEVICE_HELP)
@click.option("--calibrate", is_flag=True,
              help="Measure the verify-cost curve (and the draft's step) if not cached yet: "
                   "tens of seconds on a small CPU. Without it, cached results or priors are used.")
@click.option("--recalibrate", is_flag=True,
              help="Measure them again even if cached (do it on a quiet machine).")
@click.option("--verify", "verify_rss", is_flag=True,
              help="Then load the plan in a fresh process and compare planned memory with measured RSS.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@handle_errors
def plan_command(target, draft, budget, n_ctx, kv_type, device_json, calibrate, recalibrate,
                 verify_rss, as_json):
    """Plan proposer, draft length, GPU offload, context and KV cache for a target on this device."""
    from .. import device as devmod
    from .. import planner

    dev = devmod.from_json(device_json) if device_json else None
    p = planner.plan_for(target, draft, device=dev, budget=budget, ctx=n_ctx, kv_type=kv_type,
                         calibrate=calibrate, recalibrate=recalibrate)
    checks = []
    if verify_rss:
        if p.device.synthetic:
            raise click.UsageError("--verify measures this machine; it cannot check a --device-json plan")
        checks = planner.measure_plan(p)
    if as_json:
        d = p.to_dict()
        if checks:
            d["verification"] = [{"stage": c.stage, "planned": c.planned_host, "measured": c.measured_host,
                                  "error": round(c.error, 4)} for c in checks]
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(p.explain())
    if checks:
        click.echo("\nverification (fresh process, proposers' caches excluded):")
        for c in checks:
            click.echo(f"  {c.report()}")
