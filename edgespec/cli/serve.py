"""`edgespec serve`: the OpenAI-compatible local server (docs/server.md).

Every flag can also come from the environment (``--max-queue`` as ``EDGESPEC_MAX_QUEUE``) and
from ``serve.toml`` in the user config directory (``EDGESPEC_CONFIG`` names another file),
the flag winning over the environment, the environment over the file (click: command line,
then ``envvar``, then the context's ``default_map``). ``--print-config`` shows the outcome.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource

from .common import handle_errors
from .extras import require
from .options import engine_options, flag_values
from ..api.labels import AUTO


class _ServeCommand(click.Command):
    """Reads serve.toml into the context's default_map before the flags are parsed."""

    def make_context(self, info_name, args, parent=None, **extra):
        extra.setdefault("default_map", config_defaults(self))
        return super().make_context(info_name, args, parent=parent, **extra)


class ConfigFileError(click.ClickException):
    exit_code = 2  # bad usage, like a bad flag


def config_path() -> Path:
    """The serve.toml that is read: $EDGESPEC_CONFIG, else the platform's config dir."""
    named = os.environ.get("EDGESPEC_CONFIG")
    if named:
        return Path(named).expanduser()
    import platformdirs  # deferred: `edgespec` starts without what other commands need
    return Path(platformdirs.user_config_dir("edgespec")) / "serve.toml"


def config_defaults(command: click.Command) -> dict:
    """serve.toml as click's default_map (parameter names as keys). A missing file is no
    configuration; one that is not TOML or names an unknown key is an error (exit 2)."""
    path = config_path()
    if not path.is_file():
        if os.environ.get("EDGESPEC_CONFIG"):
            raise ConfigFileError(f"{path}: no such config file (named by $EDGESPEC_CONFIG)")
        return {}
    try:
        import tomllib  # deferred: `edgespec` starts without what other commands need
    except ImportError:  # Python 3.10
        import tomli as tomllib  # deferred: `edgespec` starts without what other commands need
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path} is not valid TOML: {e}") from None
    by_key = _config_keys(command)
    out = {}
    for key, value in data.items():
        name = by_key.get(key)
        if name is None:
            raise ConfigFileError(f"{path}: unknown key {key!r}; the keys are the flags of "
                                  "`edgespec serve --help` without their dashes (max-queue = 8)")
        out[name] = value
    return out


def _config_keys(command: click.Command) -> dict[str, str]:
    """serve.toml key -> parameter name: each long flag without its dashes, with '-' or
    '_' (``max-queue``, ``max_queue``; ``adaptive = false`` for --adaptive/--no-adaptive)."""
    keys = {}
    for p in command.params:
        if not isinstance(p, click.Option) or p.name in _NOT_CONFIGURABLE:
            continue
        for flag in p.opts:
            if flag.startswith("--"):
                keys[flag[2:]] = keys[flag[2:].replace("-", "_")] = p.name
    return keys


#: flags about one invocation, not a configuration
_NOT_CONFIGURABLE = {"print_config", "help"}


def env_name(option: click.Option) -> str:
    """EDGESPEC_ and the option's first long flag: --max-queue -> EDGESPEC_MAX_QUEUE."""
    flag = next(o for o in option.opts if o.startswith("--"))
    return "EDGESPEC_" + flag[2:].upper().replace("-", "_")


def _with_envvars(command: click.Command) -> click.Command:
    for p in command.params:
        if isinstance(p, click.Option) and p.name not in _NOT_CONFIGURABLE:
            p.envvar = env_name(p)
            p.show_envvar = True
    return command


@click.command("serve", cls=_ServeCommand)
@engine_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback needs --allow-remote.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="0 picks a free port (printed on startup).")
@click.option("--ollama-port", type=click.IntRange(0, 65535), default=None,
              help="Also listen on this port (e.g. 11434, Ollama's) so that Ollama clients "
                   "find the server unchanged: the same API, and GET / answers \"Ollama is "
                   "running\" there. 0 picks a free port (printed on startup).")
@click.option("--api-key", default=None,
              help="Require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route "
                   "but a minimal GET /health; prefer EDGESPEC_API_KEY or --api-key-file, which "
                   "keep the key out of the process table.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="Read the API key from the first line of this file.")
@click.option("--allow-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Another Host name the server answers to (besides the address it listens "
                   "on, localhost and loopback literals; others get 403, so that a web page "
                   "cannot rebind a name to it); '.example.com' allows a domain, '*' any. "
                   "Repeatable.")
@click.option("--max-connections", type=click.IntRange(1), default=256, show_default=True,
              help="Open connections the server holds; beyond it the oldest idle one is "
                   "closed, or the new one refused (503) when none is idle.")
@click.option("--max-connections-per-client", type=click.IntRange(1), default=None,
              help="Open connections one client address may hold (default: half of "
                   "--max-connections, so one client cannot take every connection).")
@click.option("--allow-remote", is_flag=True,
              help="Allow binding a non-loopback address.")
@click.option("--parallel", "-np", "parallel", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Sequences decoded together (the context holds --parallel x --ctx tokens).")
@click.option("--max-queue", type=click.IntRange(0), default=16, show_default=True,
              help="Requests waiting for a sequence beyond those running; more get 429.")
@click.option("--max-tokens-limit", type=click.IntRange(1), default=4096, show_default=True,
              help="Largest max_tokens a request may ask for (more is refused); also the "
                   "default when a request names none.")
@click.option("--model-id", "--alias", "model_id", default=None,
              help="The model id clients send (default: the target's registry name or file "
                   "stem).")
@click.option("--extra-model", "extra_models", multiple=True, metavar="[ID=]MODEL",
              help="Another model to serve beside the target (a registry name, a .gguf path, "
                   "a Hub or ollama reference), loaded on its first request with the target's "
                   "--proposer (auto where that needs --draft); ID= sets the id clients "
                   "send. Repeatable. Idle models are unloaded after --keep-alive, or sooner "
                   "when another needs their memory.")
@click.option("--keep-alive", type=click.FloatRange(-1), default=300.0, show_default=True,
              help="With several models: seconds a model stays loaded after its last request "
                   "(-1: until another model needs its memory).")
@click.option("--cache-ram", "cache_ram_mib", type=click.IntRange(0), default=None,
              help="MiB of RAM for earlier conversations' KV states (prefix reuse across "
                   "clients; least recently used evicted first; 0 keeps none). Default: the "
                   "engine's (256).")
@click.option("--canary", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=None, help="Fraction of each traffic slice's requests that run the plain "
                                 "path as the baseline; a slice where speculation stops paying "
                                 "runs plain until probes show it pays again (docs/identity.md).")
@click.option("--drain-seconds", type=click.FloatRange(0, 600), default=10.0, show_default=True,
              help="On SIGINT/SIGTERM, how long open requests may take to finish; then each "
                   "gets an error (streams an error event) and the process exits within 5 s "
                   "more. A second signal exits at once.")
@click.option("--strict", is_flag=True,
              help="Refuse request fields this server does not know (400 unknown_parameter) "
                   "instead of ignoring them with a log line.")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="A browser origin allowed to call the API (CORS), e.g. "
                   "http://localhost:3000; repeatable; '*' allows any. Default: none.")
@click.option("--timeout-read", type=click.FloatRange(0, min_open=True), default=30.0,
              show_default=True,
              help="Seconds a client has to send a request's headers, and then its body; a "
                   "connection that stalls is closed (a stalled body gets a 408 first).")
@click.option("--timeout-keep-alive", type=click.FloatRange(0, min_open=True), default=5.0,
              show_default=True, help="Seconds an idle connection is kept between requests.")
@click.option("--reasoning-format", type=click.Choice(["auto", "deepseek", "none"]),
              default="auto", show_default=True,
              help="A reasoning model's leading <think> block: split into reasoning_content "
                   "(auto, deepseek) or left in the content (none); a request's "
                   "reasoning_format overrides it.")
@click.option("--model-alias-any", is_flag=True,
              help="Serve a request naming a model this server does not serve (e.g. a client "
                   "that hard-codes gpt-4o-mini) with the default model, as llama-server does; "
                   "off: such a request is a 404.")
@click.option("--web/--no-web", default=True, show_default=True,
              help="The chat page at / (a browser view of speculation, token by token); "
                   "--no-web answers / with 404.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info",
                                                "debug"]), default="info", show_default=True)
@click.option("--print-config", is_flag=True,
              help="Print the resolved settings (and where each came from: flag, env, file, "
                   "default) as TOML, and exit without loading the model.")
@handle_errors
def serve(flags, host, port, api_key, api_key_file, allowed_hosts, max_connections, max_connections_per_client,
          allow_remote, parallel, max_queue, max_tokens_limit, model_id,
          extra_models, keep_alive, cache_ram_mib, canary, drain_seconds, strict, cors_origins, timeout_read,
          timeout_keep_alive, reasoning_format, web, log_level, print_config, ollama_port=None,
          model_alias_any=False):
    """Serve the target over an OpenAI-compatible HTTP API (chat, completions, models,
    health, metrics).

    Every flag can also be set as EDGESPEC_<FLAG> in the environment or in serve.toml
    (see --print-config); a flag wins over the environment, which wins over the file."""
    if print_config:
        click.echo(resolved_config(click.get_current_context()), nl=False)
        return
    require("server", "serve")
    from ..server import ServerSettings, create_pool_app  # deferred: `edgespec` starts without what other commands need
    from ..server.run import check_bind, is_loopback, serve as run_server  # deferred: `edgespec` starts without what other commands need
    from ..server.auth import read_key_file  # deferred: `edgespec` starts without what other commands need
    from ..server.connections import ConnectionLimits  # deferred: `edgespec` starts without what other commands need
    from ..serving import ModelPool  # deferred: `edgespec` starts without what other commands need

    check_bind(host, allow_remote)
    if api_key_file is not None:
        if api_key is not None:
            raise click.UsageError("--api-key (or $EDGESPEC_API_KEY) and --api-key-file both "
                                   "give a key; pass one")
        api_key, warning = read_key_file(api_key_file)
        if warning:
            click.echo(warning, err=True)
    limits = ConnectionLimits(max_connections, max_connections_per_client).validate()
    if not is_loopback(host) and api_key is None:
        click.echo(f"warning: serving on {host} without --api-key: anyone who can reach this "
                   "address can use the model", err=True)
    config = replace(flags.config(), parallel=parallel,
                     kv_cache_ram=None if cache_ram_mib is None else cache_ram_mib << 20).validate()
    served, aliases = _model_ids(flags.target, model_id)
    settings = ServerSettings(served_model=served, aliases=aliases, api_key=api_key,
                              max_tokens_limit=max_tokens_limit, strict=strict,
                              cors_origins=tuple(cors_origins), read_timeout=timeout_read,
                              keep_alive_timeout=timeout_keep_alive,
                              reasoning_format=reasoning_format, web=web,
                              model_alias_any=model_alias_any,
                              allowed_hosts=(host, *allowed_hosts)).validate()
    # every model is resolved and sized before anything loads: a bad name fails now
    models, budget = _pool_models(config, served, aliases, extra_models)
    pool = ModelPool(models, budget=budget,
                     keep_alive=None if len(models) == 1 or keep_alive < 0 else keep_alive,
                     load=_loader(canary, parallel, max_queue))
    pool.acquire(served).release()  # the target loads now; the others on their first request
    engine = models[0].engine
    try:
        app = create_pool_app(pool, settings)

        def started(bound_port):
            # one parseable line: scripts and tests wait for it (and learn --port 0's port)
            click.echo(f"edgespec serve: {served} on http://{host}:{bound_port}/v1 "
                       f"(proposer {engine.default_proposer}, identity {engine.identity.short})",
                       err=True)
            if web:
                click.echo(f"edgespec serve: chat page on http://{host}:{bound_port}/", err=True)

        def listening(ports):
            # the Ollama listener's port (its / says "Ollama is running"; the main one's is
            # the web page's), announced before the main line that scripts wait for
            if ollama_port is not None and len(ports) > 1:
                app.state.ollama_ports.add(ports[1])
                click.echo(f"edgespec serve: Ollama API on http://{host}:{ports[1]}",
                           err=True)

        run_server(app, host, port, drain_seconds=drain_seconds, log_level=log_level,
                   on_started=started, read_seconds=settings.read_timeout,
                   more_ports=() if ollama_port is None else (ollama_port,),
                   on_ports=listening,
                   keep_alive_seconds=settings.keep_alive_timeout, limits=limits,
                   abort=lambda: _abort_requests(pool),
                   say=lambda line: click.echo(line, err=True))
        # the app's lifespan has ended what was open and released every model (pool.close)
        click.echo("edgespec serve: stopped", err=True)
    finally:
        pool.close()


def _abort_requests(pool) -> None:
    """Shutdown, after --drain-seconds: every request still queued or running ends with an
    error its client sees (a stream's error event), none with an answer that looks whole."""
    from ..serving.tickets import ShuttingDownError  # deferred: `edgespec` starts without what other commands need
    error = ShuttingDownError("the server shut down before this request finished "
                              "(--drain-seconds passed); retry it")
    for m in pool.entries():
        scheduler = m.scheduler
        if scheduler is not None:
            scheduler.close(drain=False, timeout=0, error=error)  # told at once; no wait


def _loader(canary: float | None, parallel: int, max_queue: int):
    """The pool's ``load``: a model's engine (with the canary, if any) and its scheduler."""
    from ..engine.engine import Engine  # deferred: it loads llama.cpp
    from ..serving import PoolModel, Scheduler  # deferred: `edgespec` starts without what other commands need

    def build(m: PoolModel):
        engine = Engine.from_config(m.config)
        try:
            if canary is not None:
                from ..control.guard import CanarySettings  # deferred: `edgespec` starts without what other commands need
                engine.guard.configure_canary(CanarySettings(fraction=canary).validate())
            return engine, Scheduler(engine, parallel=parallel, max_queue=max_queue)
        except BaseException:
            engine.close()
            raise

    return build


def _pool_models(config, served: str, aliases: tuple[str, ...], extra: tuple[str, ...]):
    """The served models (the target first) with the planner's memory estimate of each, and
    the host memory budget they share (the target's plan: --budget, else what the machine
    has). Extra models run the target's --proposer, or auto where the target has a draft."""
    from ..planner import plan_engine  # deferred: `edgespec` starts without what other commands need
    from ..serving import PoolModel  # deferred: `edgespec` starts without what other commands need

    first_plan = plan_engine(config)
    models = [PoolModel(served, config=config, memory=first_plan.memory.host, aliases=aliases)]
    for spec in extra:
        ident, _, ref = spec.partition("=") if "=" in spec and "://" not in spec.split("=")[0] \
            else ("", "", spec)
        if not ref:
            raise click.BadParameter(f"{spec!r} names no model", param_hint="--extra-model")
        # the target's proposer, unless it needs the target's own draft model
        cfg = replace(config, target=ref, draft=None, chat_template=None,  # the target's only
                      proposer=AUTO if config.draft is not None else config.proposer).validate()
        name, more = _model_ids(ref, ident or None)
        taken = {n for m in models for n in (m.name, *m.aliases)}
        # another id for a model already served (smol=PATH): its other names stay with the
        # first; the id itself must be new (ModelPool refuses a repeated one)
        models.append(PoolModel(name, config=cfg, memory=plan_engine(cfg).memory.host,
                                aliases=tuple(n for n in more if n not in taken)))
    return models, first_plan.budget_host


_SOURCES = {ParameterSource.COMMANDLINE: "flag", ParameterSource.ENVIRONMENT: "env",
            ParameterSource.DEFAULT_MAP: "file", ParameterSource.DEFAULT: "default"}


def resolved_config(ctx: click.Context) -> str:
    """Each setting as a serve.toml line, with where its value came from."""
    lines = [f"# {config_path()}"]
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name in _NOT_CONFIGURABLE:
            continue
        value = ctx.params.get(p.name, flag_values(ctx).get(p.name))
        if p.name == "api_key" and value is not None:
            value = "***"  # never print the secret
        source = _SOURCES.get(ctx.get_parameter_source(p.name), "default")
        key = next(o for o in p.opts if o.startswith("--"))[2:]
        lines.append(f"{key} = {_toml(value)}  # {source}" if value is not None
                     else f"# {key} unset  # {source}")
    return "\n".join(lines) + "\n"


def _toml(value) -> str:
    import json  # deferred: `edgespec` starts without what other commands need
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def _model_ids(target: str, model_id: str | None) -> tuple[str, tuple[str, ...]]:
    """The id clients send, and the other names of the same model that are accepted."""
    names = [target]
    if target.endswith(".gguf"):
        p = Path(target)
        names += [p.name, p.stem]
    served = model_id or (Path(target).stem if target.endswith(".gguf") else target)
    return served, tuple(n for n in dict.fromkeys(names) if n != served)


_with_envvars(serve)
