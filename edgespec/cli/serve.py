"""`edgespec serve`: the OpenAI-compatible local server (docs/server.md)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from .common import handle_errors
from .options import engine_config, engine_options


@click.command("serve")
@engine_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback needs --allow-remote.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="0 picks a free port (printed on startup).")
@click.option("--api-key", default=None, envvar="EDGESPEC_API_KEY",
              help="Require 'Authorization: Bearer KEY' (also $EDGESPEC_API_KEY).")
@click.option("--allow-remote", is_flag=True,
              help="Allow binding a non-loopback address.")
@click.option("--parallel", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Sequences decoded together (the context holds --parallel x --ctx tokens).")
@click.option("--max-queue", type=click.IntRange(0), default=16, show_default=True,
              help="Requests waiting for a sequence beyond those running; more get 429.")
@click.option("--max-tokens-limit", type=click.IntRange(1), default=4096, show_default=True,
              help="Largest max_tokens a request may ask for (more is refused); also the "
                   "default when a request names none.")
@click.option("--model-id", default=None,
              help="The model id clients send (default: the target's registry name or file "
                   "stem).")
@click.option("--cache-ram", "cache_ram_mib", type=click.IntRange(0), default=None,
              help="MiB of RAM for earlier conversations' KV states (prefix reuse across "
                   "clients; least recently used evicted first; 0 keeps none). Default: the "
                   "engine's (256).")
@click.option("--canary", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=None, help="Fraction of each traffic slice's requests that run the plain "
                                 "path as the baseline; a slice where speculation stops paying "
                                 "runs plain until probes show it pays again (docs/identity.md).")
@click.option("--drain-seconds", type=click.FloatRange(0), default=60.0, show_default=True,
              help="On SIGINT/SIGTERM, how long open requests may take to finish.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info",
                                                "debug"]), default="info", show_default=True)
@handle_errors
def serve(target, draft, proposer, draft_len, adaptive, exact, n_ctx, threads, budget, host,
          port, api_key, allow_remote, parallel, max_queue, max_tokens_limit, model_id,
          cache_ram_mib, canary, drain_seconds, log_level):
    """Serve the target over an OpenAI-compatible HTTP API (chat, completions, models,
    health, metrics)."""
    from ..engine import Engine
    from ..server import ServerSettings, create_app
    from ..server.run import check_bind, is_loopback, serve as run_server
    from ..serving import Scheduler

    check_bind(host, allow_remote)
    if not is_loopback(host) and api_key is None:
        click.echo(f"warning: serving on {host} without --api-key: anyone who can reach this "
                   "address can use the model", err=True)
    config = replace(engine_config(target, draft, proposer, draft_len, adaptive, exact, n_ctx,
                                   threads, budget), parallel=parallel,
                     kv_cache_ram=None if cache_ram_mib is None else cache_ram_mib << 20).validate()
    served, aliases = _model_ids(target, model_id)
    settings = ServerSettings(served_model=served, aliases=aliases, api_key=api_key,
                              max_tokens_limit=max_tokens_limit).validate()
    engine = Engine.from_config(config)
    try:
        if canary is not None:
            from ..control.guard import CanarySettings
            engine.guard.configure_canary(CanarySettings(fraction=canary).validate())
        scheduler = Scheduler(engine, parallel=parallel, max_queue=max_queue)
        app = create_app(scheduler, engine, settings)

        def started(bound_port):
            # one parseable line: scripts and tests wait for it (and learn --port 0's port)
            click.echo(f"edgespec serve: {served} on http://{host}:{bound_port}/v1 "
                       f"(proposer {engine.default_proposer}, identity {engine.identity.short})",
                       err=True)

        run_server(app, host, port, drain_seconds=drain_seconds, log_level=log_level,
                   on_started=started)
        scheduler.close(drain=True)  # idempotent; the app's lifespan already drained it
        click.echo("edgespec serve: stopped (open requests finished)", err=True)
    finally:
        engine.close()


def _model_ids(target: str, model_id: str | None) -> tuple[str, tuple[str, ...]]:
    """The id clients send, and the other names of the same model that are accepted."""
    names = [target]
    if target.endswith(".gguf"):
        p = Path(target)
        names += [p.name, p.stem]
    served = model_id or (Path(target).stem if target.endswith(".gguf") else target)
    return served, tuple(n for n in dict.fromkeys(names) if n != served)
