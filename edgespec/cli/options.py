"""The engine flags every command that builds an engine shares (generate, plan, ...): one
definition, so `edgespec plan` shows the configuration `edgespec generate` runs."""
from __future__ import annotations

import math
import os

import click

from ..errors import EdgespecError, InvalidInputError


# --- numbers: bounded where they are read ---------------------------------------------------
def cpu_cores() -> int:
    """The CPU cores this process may run on (what --threads is bounded by)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class ThreadCount(click.ParamType):
    """--threads: 1 up to the machine's cores. More only oversubscribes them (llama.cpp's
    OpenMP pool hung at 1,000-20,000 threads and crashed at 100,000)."""

    name = "threads"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            try:
                n = int(str(value).strip(), 10)
            except ValueError:
                self.fail(f"{value!r} is not a whole number of threads", param, ctx)
        cores = cpu_cores()
        if not 1 <= n <= cores:
            self.fail(f"{n} is not between 1 and this machine's {cores} CPU cores", param, ctx)
        return n


THREADS = ThreadCount()


class FiniteFloat(click.FloatRange):
    """A float range that also refuses inf and nan (click's FloatRange takes both: `inf`
    passes a lower bound, and nan passes every comparison)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty value is not a number", param, ctx)
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(x, param, ctx)


def finite(min: float | None = None, max: float | None = None, *, min_open: bool = False,
           max_open: bool = False) -> FiniteFloat:
    """A finite float, optionally within [min, max] (open ends as click's FloatRange)."""
    return FiniteFloat(min, max, min_open=min_open, max_open=max_open)


def proposer_option(fn):
    """--proposer, validated against the proposer registry (several may be joined by '+')."""
    from ..config import EngineConfig  # deferred: `edgespec` starts without what other commands need
    from ..proposers import names  # deferred: `edgespec` starts without what other commands need

    def check(ctx, param, value):
        from ..proposers import check_label  # deferred: `edgespec` starts without what other commands need
        try:
            return check_label(value)
        except InvalidInputError as e:
            raise click.BadParameter(str(e)) from None

    return click.option(
        "--proposer", default=EngineConfig.proposer, show_default=True, callback=check,
        help=f"One of {', '.join(names(plain=True, auto=True))}, or several joined by '+' "
             "(the controller verifies the better draft each step). auto asks the planner; "
             "none is the plain path.")(fn)


def engine_options(fn):
    """The flags that build an EngineConfig, shared by generate and plan. Their defaults are
    EngineConfig's own, the ones Engine.load and the TUI open on too."""
    from ..config import EngineConfig  # deferred: `edgespec` starts without what other commands need
    for opt in reversed([
        click.option("--target", "-m", "--model", "target", default="qwen-1.5b", show_default=True,
                     help="Registry name or .gguf path (-m/--model as in llama.cpp)."),
        click.option("--draft", "-md", "--model-draft", "draft", default=None,
                     help="Draft model (registry name or .gguf path) for --proposer draft "
                          "(-md/--model-draft as in llama.cpp)."),
        proposer_option,
        click.option("--tree-width", type=click.IntRange(0, 32), default=0,
                     expose_value=False, callback=_remember("tree_width"),
                     help="Draft trees: up to N branches verified in one pass where the "
                          "device's cost curve says a tree pays (0: linear drafts)."),
        click.option("--draft-len", type=click.IntRange(1, 64), default=None,
                     help="Draft length (the maximum when adaptive control is on)."),
        click.option("--adaptive/--no-adaptive", default=True, show_default=True,
                     help="Adaptive draft length, fallback and goodput guard."),
        click.option("--exact/--no-exact", default=EngineConfig.exact, show_default=True,
                     help="Also promise greedy output bitwise equal to the plain path: verify "
                          "passes stay within the batch size this device computes bitwise like "
                          "single-token decoding (probed). The default is lossless: every token "
                          "is the target's own choice in the pass that verifies it."),
        click.option("--ctx", "-c", "--ctx-size", "n_ctx", type=click.IntRange(64), default=None,
                     help="Context size in tokens (-c/--ctx-size as in llama.cpp)."),
        click.option("--threads", "-t", "threads", type=THREADS, default=None,
                     help="CPU threads, 1 up to this machine's cores."),
        click.option("--budget", default=None, help="Memory budget for --proposer auto, e.g. 4GiB."),
        click.option("--rpc", default=None, expose_value=False, callback=_endpoints,
                     help="llama.cpp RPC servers (host:port,...) that take the target's last "
                          "layers, as many as their memory holds (`edgespec rpc-server` starts "
                          "one; docs/rpc.md)."),
        click.option("--gpu-layers", "-ngl", "--n-gpu-layers", "gpu_layers", type=click.IntRange(0),
                     default=0, expose_value=False,
                     callback=_remember("n_gpu_layers"),
                     help="Target layers to offload (to a GPU, or with --rpc to the servers); "
                          "0: as many as fit."),
        click.option("--proposer-option", "-O", multiple=True, expose_value=False,
                     callback=_proposer_options, metavar="NAME.KEY=VALUE",
                     help="A proposer's option, e.g. self.layers=0-5,22-27 or "
                          "ngram.max_draft=6; repeatable (`edgespec plan` lists each "
                          "proposer's options)."),
        click.option("--tensor-split", default=None, expose_value=False, callback=_shares,
                     help="With --rpc: each remote device's share of the offloaded layers, "
                          "e.g. 1,1 (default: by free memory)."),
        click.option("--chat-template", default=None, expose_value=False,
                     type=click.Path(exists=True, dir_okay=False), callback=_chat_template,
                     metavar="FILE",
                     help="A Jinja chat template file to use instead of the target GGUF's own "
                          "(for a model whose template fails or that has none)."),
    ]):
        fn = opt(fn)
    return fn


def _remember(name: str):
    """A click callback keeping a flag in the command's context (read by engine_config),
    so adding an engine flag does not change every command's signature."""
    def keep(ctx: click.Context, _param, value):
        ctx.meta[f"edgespec.{name}"] = value
        return value
    return keep


def _endpoints(ctx: click.Context, _param, value):
    from ..runtime.rpc import parse_endpoints  # deferred: `edgespec` starts without what other commands need
    try:
        ctx.meta["edgespec.rpc"] = parse_endpoints(value)
    except InvalidInputError as e:
        raise click.BadParameter(str(e)) from None
    return value


def _proposer_options(ctx: click.Context, _param, values):
    from ..proposers import spec  # deferred: `edgespec` starts without what other commands need
    out: dict[str, dict] = {}
    for item in values:
        head, eq, value = item.partition("=")
        name, dot, key = head.partition(".")
        if not (eq and dot and name and key):
            raise click.BadParameter(f"{item!r} is not NAME.KEY=VALUE, e.g. self.layers=first:14")
        try:
            out.setdefault(name, {}).update(spec(name).check_options({key: value}))
        except InvalidInputError as e:
            raise click.BadParameter(str(e)) from None
    ctx.meta["edgespec.proposer_options"] = out
    return values


def _shares(ctx: click.Context, _param, value):
    if value is None:
        return None
    try:
        shares = tuple(float(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers, e.g. 3,1") from None
    ctx.meta["edgespec.tensor_split"] = shares
    return value


def _chat_template(ctx: click.Context, _param, value):
    """--chat-template FILE: read and compiled now, so a bad file fails before any load."""
    if value is None:
        return None
    from ..chat.sandbox import read_template_file  # deferred: jinja2 loads only here
    try:
        ctx.meta["edgespec.chat_template_text"] = read_template_file(value)
    except EdgespecError as e:
        raise click.BadParameter(str(e)) from None
    ctx.meta["edgespec.chat_template"] = value
    return value


def engine_config(target, draft, proposer, draft_len, adaptive, exact, n_ctx, threads, budget):
    from ..config import EngineConfig  # deferred: `edgespec` starts without what other commands need
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    _check_draft_used(draft, proposer)
    return EngineConfig(target=target, draft=draft, proposer=proposer, draft_len=draft_len,
                        adaptive=adaptive, exact=exact, n_ctx=n_ctx, threads=threads,
                        budget=budget, tree_width=meta.get("edgespec.tree_width", 0),
                        rpc=meta.get("edgespec.rpc", ()),
                        n_gpu_layers=meta.get("edgespec.n_gpu_layers", 0),
                        tensor_split=meta.get("edgespec.tensor_split"),
                        proposer_options=meta.get("edgespec.proposer_options", {}),
                        chat_template=meta.get("edgespec.chat_template_text")).validate()


def _check_draft_used(draft, proposer) -> None:
    """--draft with proposers that never read a draft model would load it for nothing (and
    let the user believe it drafts): refuse it, naming both ways out."""
    from ..api.labels import AUTO  # deferred: `edgespec` starts without what other commands need
    from ..proposers import needs_model  # deferred: as above
    if draft is None or proposer == AUTO:
        return
    if not any(needs_model(n) for n in proposer.split("+")):
        raise click.UsageError(
            f"--draft {draft} is not used by --proposer {proposer}; add a proposer that drafts "
            f"with a model (--proposer draft, or {proposer}+draft to combine them) or leave "
            "out --draft")


def structured_options(fn):
    """--grammar / --json-schema / --json-mode, shared by generate and chat."""
    for opt in reversed([
        click.option("--grammar", "grammar_file", type=click.Path(exists=True, dir_okay=False),
                     default=None, help="Constrain the output to a GBNF grammar file "
                                        "(llama.cpp's format)."),
        click.option("--json-schema", "schema_file", type=click.Path(exists=True, dir_okay=False),
                     default=None, help="Constrain the output to JSON valid under this JSON "
                                        "schema file."),
        click.option("--json-mode", is_flag=True,
                     help="Constrain the output to one JSON object (--json is the output record "
                          "flag)."),
    ]):
        fn = opt(fn)
    return fn


def structured_params(grammar_file, schema_file, json_mode) -> dict:
    """GenerationParams fields for the structured-output flags (validated with the params)."""
    return {"grammar": read_text_file(grammar_file, "--grammar"),
            "json_schema": read_text_file(schema_file, "--json-schema"),
            "json_mode": bool(json_mode)}


def read_text_file(path, flag: str) -> str | None:
    """A UTF-8 text file named by ``flag``, or a clear error (never a decode traceback)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidInputError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(
            f"{flag} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "convert it first, e.g. with iconv -f latin1 -t UTF-8") from None
