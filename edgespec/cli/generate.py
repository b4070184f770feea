"""`edgespec generate`: one-shot generation, streamed to stdout."""
from __future__ import annotations

import json
import sys

import click

from .common import handle_errors
from .interrupts import in_thread, interrupts
from .options import engine_options, finite, structured_options, structured_params
from ..errors import Cancelled, InvalidInputError
from ..api.params import GenerationParams, SamplingParams
from ..api.events import Control, Finished, Step



def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin when it is absent or '-'; stdin must be UTF-8."""
    if prompt is not None and prompt != "-":
        return prompt
    if sys.stdin is None or (sys.stdin.isatty() and prompt is None):
        raise InvalidInputError("no prompt: pass it as an argument or pipe it on stdin")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"stdin is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset "
                                f"{e.start}); convert it first, e.g. with iconv -t UTF-8") from None


@click.command()
@click.argument("prompt", required=False)
@engine_options
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=finite(0.0), default=0.0, show_default=True,
              help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(0), default=0, help="0 = off.")
@click.option("--top-p", type=finite(0.0, 1.0, min_open=True), default=1.0)
@click.option("--min-p", type=finite(0.0, 1.0, max_open=True), default=0.0)
@click.option("--repeat-penalty", type=finite(0.0, min_open=True), default=1.0)
@click.option("--presence-penalty", type=finite(), default=0.0)
@click.option("--frequency-penalty", type=finite(), default=0.0)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable); never printed.")
@click.option("--chat/--raw", default=True, show_default=True,
              help="Apply the model's own GGUF chat template, or send the prompt as raw text.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--logprobs", type=click.IntRange(0, 20), default=None,
              help="Report each token's log-probability and N alternatives (with --json).")
@structured_options
@click.option("--stats", "show_stats", is_flag=True, help="Print a stats summary to stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record instead of streaming text.")
@handle_errors
def generate(prompt, flags, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
             presence_penalty, frequency_penalty, seed, stop, chat, system, logprobs,
             grammar_file, schema_file, json_mode, show_stats, as_json):
    """Generate a completion for PROMPT (or stdin)."""
    with interrupts() as intr:  # Ctrl-C: the first cancels, a second exits at once
        from ..engine.engine import Engine  # a second or more of imports: inside, too

        text = read_prompt(prompt)
        params = GenerationParams(
            max_tokens=max_tokens, stop=tuple(stop), chat=chat, system=system, logprobs=logprobs,
            **structured_params(grammar_file, schema_file, json_mode),
            sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                    min_p=min_p, repeat_penalty=repeat_penalty,
                                    presence_penalty=presence_penalty,
                                    frequency_penalty=frequency_penalty, seed=seed),
        ).validate()
        config = flags.config()
        engine = Engine.from_config(config)
        intr.on_first(engine.cancel)
        try:
            _run(engine, text, params, intr, flags.target, show_stats, as_json, logprobs)
        finally:
            engine.close()


def _run(engine, text, params, intr, target, show_stats, as_json, logprobs) -> None:
    """One request, printed as it streams (or as one JSON record)."""

    if engine.plan is not None and show_stats and not as_json:
        from ..planner import check_memory  # deferred: `edgespec` starts without what other commands need
        click.echo(f"[plan] {_plan_line(engine.plan)}", err=True)
        click.echo(f"[plan] {check_memory(engine.plan, 'load').report()}", err=True)
    fin = None
    controls = []
    # the request runs on a worker thread, so a Ctrl-C is taken here at once
    for ev in in_thread(engine.stream(text, params), engine.cancel):
        if intr.interrupted:  # an interrupt before the request began cleared no flag
            engine.cancel()
        if isinstance(ev, Step) and not as_json:
            click.echo(ev.text, nl=False)
            sys.stdout.flush()
        elif isinstance(ev, Control):
            controls.append({"kind": ev.kind, "reason": ev.reason})
        elif isinstance(ev, Finished):
            fin = ev
    if as_json:
        rec = {"text": fin.text, "tokens": list(fin.tokens), "stop_reason": fin.stop_reason,
               "target": target, "proposer": engine.default_proposer,
               "stats": fin.stats.to_dict(), "control": controls}
        # the release this record measured: its hash, and the full record (once per run)
        ident = engine.identity
        rec["identity"] = ident.hash
        rec["identity_record"] = ident.to_dict()
        if logprobs is not None:
            rec["logprobs"] = [{"token": lp.token, "logprob": lp.logprob,
                                "top": [[t, v] for t, v in lp.top]} for lp in fin.logprobs]
        click.echo(json.dumps(rec))
    else:
        click.echo()
    if show_stats:
        click.echo(fin.stats.summary(), err=True)
        from ..engine.notes import idle_reason  # deferred: `edgespec` starts without the engine
        why = idle_reason(engine, fin.stats)
        if why:
            click.echo(why, err=True)
    if fin.stop_reason == "cancelled":
        raise Cancelled("cancelled")
    _warn_unfinished(params, fin)


def _warn_unfinished(params: GenerationParams, fin) -> None:
    """A constrained output cut short is not valid under its grammar: say so, and why."""
    from ..grammar.constraint import constraint_for  # cached: structured_params built it

    if constraint_for(params) is None or fin.stop_reason == "eos":
        return
    why = {"length": "--max-tokens was reached; raise it",
           "grammar": "no token of this model can continue the grammar here",
           "stop": "a --stop string ended it", "context": "the context is full; raise --ctx"}
    click.echo(f"[grammar] the output is incomplete under the grammar: "
               f"{why.get(fin.stop_reason, fin.stop_reason)}", err=True)


def _plan_line(plan) -> str:
    """What runs (the plan's resolved config, as `edgespec plan` shows it) and why."""
    runs = plan.config.proposer
    why = next((r for r in plan.reasons if r.startswith("runs")), None) or \
        next((r for r in plan.reasons if r.startswith("chosen")), "")
    return f"proposer {runs}, predicted {plan.predicted_speedup:.2f}x plain: {why}"
