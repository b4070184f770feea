"""The engine flags every command that builds an engine shares (generate, plan, ...): one
definition, so `edgespec plan` shows the configuration `edgespec generate` runs."""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from typing import Mapping

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


#: where the engine flags' values gather while click parses (ctx.meta), keyed by option name
_FLAGS = "edgespec.engine_flags"


@dataclass(frozen=True)
class EngineFlags:
    """Every engine flag of one command line, handed to the command as one value
    (``flags``): the one path from the flags to :class:`edgespec.config.EngineConfig`."""

    target: str
    draft: str | None
    proposer: str
    max_draft: int | None
    adaptive: bool
    exact: bool
    n_ctx: int | None
    threads: int | None
    budget: str | None
    tree_width: int = 0
    rpc: tuple = ()
    n_gpu_layers: int = 0
    tensor_split: tuple[float, ...] | None = None
    proposer_options: Mapping[str, Mapping] = field(default_factory=dict)
    chat_template: str | None = None  # the --chat-template file's text, read and compiled
    use_mmap: bool | None = None  # --no-mmap: False, --mmap: True

    def config(self):
        """The validated EngineConfig these flags ask for (a --draft nothing reads refused)."""
        from ..config import EngineConfig  # deferred: `edgespec` starts without what other commands need
        _check_draft_used(self.draft, self.proposer)
        return EngineConfig(
            target=self.target, draft=self.draft, proposer=self.proposer,
            max_draft=self.max_draft, adaptive=self.adaptive, exact=self.exact,
            n_ctx=self.n_ctx, threads=self.threads, budget=self.budget,
            tree_width=self.tree_width, rpc=self.rpc, n_gpu_layers=self.n_gpu_layers,
            tensor_split=self.tensor_split, proposer_options=self.proposer_options,
            chat_template=self.chat_template, use_mmap=self.use_mmap).validate()


def flag_values(ctx: click.Context) -> dict:
    """The engine flags parsed so far, by option name (serve prints them with the others)."""
    return ctx.meta.setdefault(_FLAGS, {})


def _keep(convert=None):
    """A click callback that files an engine flag's value (converted) under its name."""
    def keep(ctx: click.Context, param, value):
        flag_values(ctx)[param.name] = convert(value) if convert is not None else value
        return value
    return keep


def engine_options(fn):
    """The flags that build an EngineConfig, shared by generate, chat, plan, identity and
    serve. They reach the command as one :class:`EngineFlags` argument named ``flags``; their
    defaults are EngineConfig's own, the ones Engine.load and the TUI open on too."""
    from ..config import EngineConfig  # deferred: `edgespec` starts without what other commands need
    from ..proposers import names  # deferred: `edgespec` starts without what other commands need

    @functools.wraps(fn)
    def with_flags(*args, **kwargs):
        v = flag_values(click.get_current_context())
        flags = EngineFlags(
            target=v["target"], draft=v["draft"], proposer=v["proposer"],
            max_draft=v["max_draft"], adaptive=v["adaptive"], exact=v["exact"],
            n_ctx=v["n_ctx"], threads=v["threads"], budget=v["budget"],
            tree_width=v["tree_width"], rpc=v["rpc"], n_gpu_layers=v["gpu_layers"],
            tensor_split=v["tensor_split"], proposer_options=v["proposer_option"],
            chat_template=v["chat_template"], use_mmap=v["mmap"])
        return fn(*args, flags=flags, **kwargs)

    hidden = dict(expose_value=False)
    for opt in reversed([
        click.option("--target", "-m", "--model", "target", default="qwen-1.5b", show_default=True,
                     callback=_keep(), **hidden,
                     help="Registry name or .gguf path (-m/--model as in llama.cpp)."),
        click.option("--draft", "-md", "--model-draft", "draft", default=None,
                     callback=_keep(), **hidden,
                     help="Draft model (registry name or .gguf path) for --proposer draft "
                          "(-md/--model-draft as in llama.cpp)."),
        click.option(
            "--proposer", default=EngineConfig.proposer, show_default=True,
            callback=_keep(_check_proposer), **hidden,
            help=f"One of {', '.join(names(plain=True, auto=True))}, or several joined by '+' "
                 "(the controller verifies the better draft each step). auto asks the planner; "
                 "none is the plain path."),
        click.option("--tree-width", type=click.IntRange(0, 32), default=0,
                     callback=_keep(), **hidden,
                     help="Draft trees: up to N branches verified in one pass where the "
                          "device's cost curve says a tree pays (0: linear drafts)."),
        click.option("--max-draft", "--draft-max", "max_draft", type=click.IntRange(1, 64),
                     default=None, callback=_keep(), **hidden,
                     help="The most tokens one pass drafts: adaptive control's cap, or "
                          "without it every draft's length (llama.cpp's --draft-max)."),
        click.option("--adaptive/--no-adaptive", default=True, show_default=True,
                     callback=_keep(), **hidden,
                     help="Adaptive draft length, fallback and goodput guard."),
        click.option("--exact/--no-exact", default=EngineConfig.exact, show_default=True,
                     callback=_keep(), **hidden,
                     help="Also promise greedy output bitwise equal to the plain path: verify "
                          "passes stay within the batch size this device computes bitwise like "
                          "single-token decoding (probed). The default is lossless: every token "
                          "is the target's own choice in the pass that verifies it."),
        click.option("--ctx", "-c", "--ctx-size", "n_ctx", type=click.IntRange(64), default=None,
                     callback=_keep(), **hidden,
                     help="Context size in tokens (-c/--ctx-size as in llama.cpp)."),
        click.option("--mmap/--no-mmap", "mmap", default=None,
                     callback=_keep(), **hidden,
                     help="--no-mmap reads the weights into RAM (as llama.cpp's --no-mmap), "
                          "--mmap maps the file. Unasked, a CPU load that repacks the weights "
                          "reads them into RAM where they can go on huge pages (faster decode, "
                          "one copy resident), else maps the file."),
        click.option("--threads", "-t", "threads", type=THREADS, default=None,
                     callback=_keep(), **hidden,
                     help="CPU threads, 1 up to this machine's cores."),
        click.option("--budget", default=None, callback=_keep(), **hidden,
                     help="Memory budget for --proposer auto, e.g. 4GiB."),
        click.option("--rpc", default=None, callback=_keep(_endpoints), **hidden,
                     help="llama.cpp RPC servers (host:port,...) that take the target's last "
                          "layers, as many as their memory holds (`edgespec rpc-server` starts "
                          "one; docs/rpc.md)."),
        click.option("--gpu-layers", "-ngl", "--n-gpu-layers", "gpu_layers", type=click.IntRange(0),
                     default=0, callback=_keep(), **hidden,
                     help="Target layers to offload (to a GPU, or with --rpc to the servers); "
                          "0: as many as fit."),
        click.option("--proposer-option", "-O", multiple=True, metavar="NAME.KEY=VALUE",
                     callback=_keep(_proposer_options), **hidden,
                     help="A proposer's option, e.g. self.layers=0-5,22-27 or "
                          "ngram.max_draft=6; repeatable (`edgespec plan` lists each "
                          "proposer's options)."),
        click.option("--tensor-split", default=None, callback=_keep(_shares), **hidden,
                     help="With --rpc: each remote device's share of the offloaded layers, "
                          "e.g. 1,1 (default: by free memory)."),
        click.option("--chat-template", default=None, metavar="FILE",
                     type=click.Path(exists=True, dir_okay=False),
                     callback=_keep(_chat_template), **hidden,
                     help="A Jinja chat template file to use instead of the target GGUF's own "
                          "(for a model whose template fails or that has none)."),
    ]):
        with_flags = opt(with_flags)
    return with_flags


def _bad_parameter(fn):
    """Parse errors of a flag's value as click's own (the flag named, usage shown)."""
    @functools.wraps(fn)
    def convert(value):
        try:
            return fn(value)
        except InvalidInputError as e:
            raise click.BadParameter(str(e)) from None
    return convert


@_bad_parameter
def _check_proposer(value):
    from ..proposers import check_label  # deferred: `edgespec` starts without what other commands need
    return check_label(value)


@_bad_parameter
def _endpoints(value):
    from ..runtime.rpc import parse_endpoints  # deferred: `edgespec` starts without what other commands need
    return parse_endpoints(value)


def _proposer_options(values) -> dict[str, dict]:
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
    return out


def _shares(value) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        return tuple(float(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers, e.g. 3,1") from None


def _chat_template(value) -> str | None:
    """--chat-template FILE: read and compiled now, so a bad file fails before any load."""
    if value is None:
        return None
    from ..chat.sandbox import read_template_file  # deferred: jinja2 loads only here
    try:
        return read_template_file(value)
    except EdgespecError as e:
        raise click.BadParameter(str(e)) from None


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
    """GenerationParams fields for the structured-output flags, checked by the parser that
    will enforce them before any model loads."""
    from ..grammar.constraint import constraint_of  # deferred: it can load llama.cpp

    fields = {"grammar": read_text_file(grammar_file, "--grammar"),
              "json_schema": read_text_file(schema_file, "--json-schema"),
              "json_mode": bool(json_mode)}
    constraint_of(**fields)
    return fields


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
