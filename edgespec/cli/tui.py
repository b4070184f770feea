"""`edgespec tui`: the Textual app over the engine's event stream (package `edgespec.tui`)."""
from __future__ import annotations

import click

from .common import handle_errors
from .options import THREADS
from .extras import require


@click.command("tui")
@click.option("--target", "-m", metavar="NAME|PATH", help="Target model: registry name or .gguf path.")
@click.option("--proposer", "-p", metavar="NAME",
              help="A proposer from the registry, auto or none (`edgespec generate --help`); "
                   "default: the engine's (with --draft: the draft proposer).")
@click.option("--draft", metavar="NAME|PATH", help="Draft model for --proposer draft.")
@click.option("--max-draft", type=int, help="Fixed draft length (default: adaptive).")
@click.option("--n-ctx", type=click.IntRange(16), default=None,
              help="Context window (default: the engine's, 4096 or what the model was trained "
                   "for).")
@click.option("--threads", type=THREADS, help="CPU threads (default: physical cores).")
@click.option("--exact/--no-exact", default=None,
              help="Open with \"exact greedy\" on or off (default: the engine's).")
@click.option("--prompt", default="", help="Text to put in the prompt box.")
@click.option("--demo", is_flag=True, help="Replay a scripted request: no model needed.")
@handle_errors
def tui_command(target, proposer, draft, max_draft, n_ctx, threads, exact, prompt, demo):
    """Interactive speculation: stream answers with accepted draft tokens coloured.

    Keys: ctrl+r run, Esc cancel, F1 help, F2 settings, F3 colours, ctrl+q quit.
    """
    require("tui", "tui")
    # Imported here so other commands never pay for Textual.
    from ..tui import create_app  # deferred: `edgespec` starts without what other commands need
    from ..tui.demo import DEMO_PROMPT, demo_events  # deferred: `edgespec` starts without what other commands need
    from ..tui.source import (Choices, EngineSource, ScriptedSource, Settings, default_proposer,  # deferred: `edgespec` starts without what other commands need
                              proposer_names)
    from ..proposers import needs_model  # deferred: `edgespec` starts without what other commands need

    if demo:
        source = ScriptedSource(demo_events, realtime=True, choices=Choices(
            targets=("demo",), drafts=("demo-draft",), proposers=proposer_names(),
            default_target="demo", default_draft="demo-draft"))
        prompt = prompt or DEMO_PROMPT
    else:
        source = EngineSource(n_ctx=n_ctx, threads=threads)
    settings = None
    if target or proposer or draft or max_draft or exact is not None:
        choices = source.models()
        if proposer is None:
            model_based = [n for n in proposer_names() if needs_model(n)]
            proposer = model_based[0] if draft and model_based else default_proposer()
        settings = Settings(target=target or choices.default_target or "", proposer=proposer,
                            draft=draft or (choices.default_draft if needs_model(proposer) else None),
                            max_draft=max_draft,
                            **({} if exact is None else {"exact": exact}))
    create_app(source, initial_prompt=prompt, settings=settings).run()
