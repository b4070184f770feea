"""`edgespec plan`: what `edgespec generate` would run, where, and why, without generating.

It takes generate's engine flags and builds the same EngineConfig, so the plan shown is
the plan that runs (the same kernel configuration, KV type included)."""
from __future__ import annotations

import json
from dataclasses import replace

import click

from .common import handle_errors
from .options import engine_options

_DEVICE_HELP = ("JSON file describing another machine instead of probing this one: "
                '{"ram_available": "16GiB", "gpus": [{"name": "RTX 4060", "free": "7.5GiB", '
                '"total": "8GiB"}], "speed": {"verify_costs": {"2": 1.02, "8": 1.1}, '
                '"draft_step_ratio": 0.15}} (every key optional; see edgespec/runtime/device.py).')


@click.command("plan")
@engine_options
@click.option("--kv-type", type=click.Choice(["f16", "q8_0", "q4_0"]), default=None,
              help="Force the KV cache type (default: the engine's q8_0; quantized further "
                   "only if it does not fit, never in --exact mode).")
@click.option("--device-json", type=click.Path(exists=True, dir_okay=False), default=None,
              help=_DEVICE_HELP)
@click.option("--calibrate", is_flag=True,
              help="Measure the verify-cost curve and the exactness cap (and the draft's step) "
                   "if not cached yet: seconds to a minute on a small CPU. Without it, cached "
                   "results or priors are used.")
@click.option("--recalibrate", is_flag=True,
              help="Measure them again even if cached (do it on a quiet machine).")
@click.option("--verify", "verify_rss", is_flag=True,
              help="Then load the plan in a fresh process and compare planned memory with measured RSS.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@handle_errors
def plan_command(flags, kv_type, device_json, calibrate, recalibrate, verify_rss, as_json):
    """Plan proposer, draft length, GPU offload, context and kernel configuration (KV cache,
    repacked weights, mmap) for a target on this device, and what --exact would verify."""
    from ..runtime import device as devmod  # deferred: `edgespec` starts without what other commands need
    from .. import planner  # deferred: `edgespec` starts without what other commands need

    cfg = flags.config()
    if kv_type is not None:
        cfg = replace(cfg, kernel=replace(cfg.layout(), kv_type=kv_type))
    dev = devmod.from_json(device_json) if device_json else None
    p = planner.plan_engine(cfg, device=dev, calibrate=calibrate, recalibrate=recalibrate,
                            kv_type=kv_type)
    checks = []
    if verify_rss:
        if p.device.synthetic:
            raise click.UsageError("--verify measures this machine; it cannot check a --device-json plan")
        checks = planner.measure_plan(p, n_threads=flags.threads)
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
