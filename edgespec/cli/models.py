"""`edgespec models list|add|remove|pull|verify|path|optimize`: the registries from the command line."""
from __future__ import annotations

import functools
import json
import sys

import click

from .. import paths, registry
from .common import handle_errors
from ..errors import ModelError
from ..registry import hub, refs, scan, user


class _RegistryProblem(click.ClickException):
    exit_code = 2


def _exit_2(fn):
    """A registry problem the user must fix (bad user registry, clashing name, not a GGUF
    file) exits 2 with its one-line message, like a usage error: nothing ran."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ModelError as e:
            raise _RegistryProblem(str(e)) from None

    return wrapper


def _human(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _progress(message: str) -> None:
    click.echo(f"edgespec: {message}", err=True)


@click.group("models")
def models() -> None:
    """List, add, pull and verify GGUF models: the shipped registry and your own
    ($EDGESPEC_HOME/models.toml)."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@handle_errors
@_exit_2
def list_models(as_json: bool) -> None:
    """Every registry model, whether it is pulled, and every target–proposer pair.

    FROM is "shipped" (the registry installed with edgespec) or "user" (added with
    `edgespec models add`). STATUS is "verified" (digest checked since the file last
    changed), "unverified" (present; `models verify` hashes it), "wrong size" or "missing".
    """
    from ..registry import optimize  # deferred: as in optimize_model

    reg = registry.load_registry()
    rows = []
    for spec in reg.models.values():
        made = optimize.source_check(spec, hash_=False)  # no hashing in a listing
        rows.append({
            "name": spec.name, "origin": reg.origin(spec.name), "role": spec.role,
            "size": spec.size, "quant": spec.quant,
            "tokenizer": spec.tokenizer, "context": spec.context,
            "chat_template": spec.chat_template, "status": registry.model_status(spec.name),
            "path": str(registry.model_path(spec.name)),
            "derived": None if spec.derived is None else {
                "from": spec.derived.source, "sha256": spec.derived.sha256,
                "change": spec.derived.change, "stale": made is not None and made.stale,
                "note": made.message if made is not None else ""},
        })
    pairs = []
    for p in reg.pairs:
        slices = registry.qualification(p.target, p.key)
        pairs.append({"target": p.target, "proposer": p.key, "qualified_slices": sorted(slices)})
    if as_json:
        click.echo(json.dumps({"home": str(paths.edgespec_home()), "registry": str(reg.path),
                               "user_registry": str(paths.user_registry_path()),
                               "default_target": reg.default_target,
                               "default_draft": reg.default_draft,
                               "models": rows, "pairs": pairs}, indent=2))
        return
    header = ("NAME", "FROM", "ROLE", "SIZE", "QUANT", "TOKENIZER", "CTX", "CHAT", "STATUS")
    table = [header] + [(r["name"], r["origin"], r["role"], _human(r["size"]), r["quant"],
                         r["tokenizer"], str(r["context"]), "yes" if r["chat_template"] else "no",
                         r["status"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    copies = [r for r in rows if r["derived"]]
    if copies:
        click.echo("\nCOPIES (`edgespec models optimize`)")
        for r in copies:
            click.echo(f"{r['name']}  {r['derived']['note']}")
    click.echo(f"\nmodels in {paths.models_dir()}  (default target {reg.default_target}, "
               f"draft {reg.default_draft or '-'})")
    click.echo(f"shipped registry {reg.path}; your models: {paths.user_registry_path()}"
               + ("" if reg.user_path else " (none yet: `edgespec models add NAME PATH`)"))
    click.echo("\nPAIRS")
    pw = max((len(p["target"]) for p in pairs), default=0)
    kw = max((len(p["proposer"]) for p in pairs), default=0)
    for p in pairs:
        qual = ("qualified: " + ", ".join(p["qualified_slices"])) if p["qualified_slices"] \
            else "not qualified yet"
        click.echo(f"{p['target'].ljust(pw)}  + {p['proposer'].ljust(kw)}  {qual}")


@models.command("add")
@click.argument("name")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--role", type=click.Choice(registry.ROLES), default="target", show_default=True,
              help="What the model is for (a draft is offered as a draft for targets).")
@click.option("--tokenizer", default=None,
              help="Tokenizer id for pairing (default: architecture-kind-vocabulary from the "
                   "header; drafts pair only with targets of the same id).")
@handle_errors
@_exit_2
def add_model(name: str, path: str, role: str, tokenizer: str | None) -> None:
    """Add your own GGUF file PATH as model NAME (your registry, $EDGESPEC_HOME/models.toml).

    PATH may also be a name `edgespec models scan` prints (`ollama:qwen2.5-coder:7b`):
    the file it names is pinned. A Hugging Face reference (`hf://OWNER/REPO/FILE.gguf`,
    `OWNER/REPO:QUANT`) is pulled into the Hugging Face cache and pinned at its commit.

    The file is checked (GGUF header, not truncated) and its sha256 pinned, so `--target
    NAME` refuses it if it changes later. The file stays where it is.
    """
    if refs.is_store_ref(path):  # a model `models scan` found: pin the file it names
        path = str(scan.resolve_ref(path, progress=_progress))
    source = None
    if hub.is_hub_ref(path):  # pulled and pinned at its commit, so NAME never moves with main
        fetched = hub.fetch(path, progress=_progress)
        path, source = str(fetched.path), fetched.uri
    spec = user.add(name, path, role=role, tokenizer=tokenizer, progress=_progress, hub=source)
    click.echo(f"{spec.name}\t{spec.path}\t{spec.sha256}")
    click.echo(f"added to {paths.user_registry_path()}; use it with --target {spec.name}",
               err=True)


@models.command("pin-bridge")
@click.argument("target")
@click.argument("draft")
@handle_errors
@_exit_2
def pin_bridge(target: str, draft: str) -> None:
    """Let DRAFT, a model with another tokenizer, draft for TARGET through the bridge
    (`--proposer bridge`; docs/bridge.md): pins both vocabularies' digests and this
    bridge's version as a pair in your registry. Both are registry names (yours or
    shipped); a file whose tokenizer changes later is refused until pinned again."""
    from ..registry import bridge_pins as bridges  # deferred: it loads llama.cpp

    pins, written = bridges.pin_user(target, draft)
    click.echo(f"{target} + bridge:{draft}\t{pins['target_vocab_sha256']}\t"
               f"{pins['draft_vocab_sha256']}")
    click.echo(f"pinned in {paths.user_registry_path()}" if written else
               "already pinned at this bridge version", err=True)


@models.command("remove")
@click.argument("name")
@handle_errors
@_exit_2
def remove_model(name: str) -> None:
    """Remove model NAME from your registry (the file itself is not deleted)."""
    entry, dropped = user.remove(name)
    for p in dropped:
        click.echo(f"also removed the pair {p.get('target')} + {p.get('draft') or p.get('proposer')}",
                   err=True)
    where = entry.get("path") if isinstance(entry, dict) else None
    click.echo(f"removed {name}" + (f" (the file {where} is still there)" if where else ""))


@models.command("pull")
@click.argument("names", nargs=-1)
@click.option("--all", "pull_all", is_flag=True, help="Pull every registry model.")
@click.option("--force", is_flag=True, help="Re-pull even if the file is present and verifies "
              "(a Hub file: download it again and pin what arrives).")
@handle_errors
def pull_models(names: tuple[str, ...], pull_all: bool, force: bool) -> None:
    """Install, assemble and verify models into $EDGESPEC_HOME/models.

    With no NAMES, pulls the default target and draft. A present file with the
    right digest is left alone; a file whose digest does not match is refused.

    A NAME may be a Hugging Face reference: `hf://OWNER/REPO/FILE.gguf` (`@REV` after
    the repo for a branch, tag or commit) or `OWNER/REPO:QUANT` (the repo's GGUF file
    of that quant, Q4_K_M when left out). It goes into the Hugging Face cache (HF_HOME,
    HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE apply); its sha256 is recorded at the first
    pull and checked afterwards.
    """
    reg = registry.load_registry()
    if pull_all and names:
        raise click.UsageError("give model names or --all, not both")
    if pull_all:
        names = tuple(n for n, spec in reg.models.items() if not spec.local)
    elif not names:
        names = tuple(n for n in (reg.default_target, reg.default_draft) if n)
    for name in names:  # every name is checked before a long download starts
        if hub.is_hub_ref(name):
            hub.parse(name)
        else:
            reg.get(name)
    for name in names:
        if hub.is_hub_ref(name):
            path = hub.pull(name, force=force, progress=_progress)
        else:
            path = registry.pull(name, force=force, progress=_progress)
        click.echo(f"{name}\t{path}")


@models.command("verify")
@click.argument("names", nargs=-1)
@handle_errors
def verify_models(names: tuple[str, ...]) -> None:
    """Re-hash models (registry names or .gguf paths) against their pinned sha256.

    With no NAMES, verifies every pulled registry model. Exits 1 if any file
    does not match or an explicitly named model is not pulled.
    """
    reg = registry.load_registry()
    explicit = bool(names)
    if not names:
        names = tuple(n for n in reg.models if registry.model_path(n).is_file())
        if not names:
            click.echo("no models pulled yet; run `edgespec models pull`")
            return
    failures = 0
    for name in names:
        try:
            v = registry.verify(name, progress=_progress)
        except ModelError as e:
            if not explicit:
                raise
            click.echo(f"{name}\tFAILED\t{e}")
            failures += 1
            continue
        status = "ok" if v.ok else "MISMATCH"
        detail = "" if v.message == "ok" else f"\t{v.message}"
        made = _source_check(name) if v.ok else None
        if made is not None and made.stale:
            status, detail = "STALE", f"\t{made.message}"
        click.echo(f"{name}\t{status}\t{v.actual_sha256}{detail}")
        if made is not None and not made.stale:
            click.echo(f"{name}: {made.message}", err=True)
        failures += not v.ok or (made is not None and made.stale)
    if failures:
        click.echo(f"{failures} of {len(names)} failed verification", err=True)
        sys.exit(1)


def _source_check(name: str):
    """A copy's source check (edgespec.registry.optimize.source_check); None for a path,
    a scanned model (ollama:..., lmstudio:..., not in the registry) or a model that is not
    a copy."""
    from ..registry import optimize  # deferred: as in optimize_model

    spec = None if registry.is_path_like(name) else registry.load_registry().models.get(name)
    return None if spec is None else optimize.source_check(spec, progress=_progress)


@models.command("optimize")
@click.argument("name")
@click.option("--name", "new_name", default=None,
              help="Name of the copy in your registry (default: NAME-q8).")
@click.option("--quantize", type=click.Path(dir_okay=False), default=None,
              help="llama.cpp's llama-quantize (default: the one `make anchors` builds, else "
                   "the one on PATH).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Quantizer threads (default: every core).")
@click.option("--force", is_flag=True, help="Make the copy again (a copy made before, e.g. "
              "from a source that changed since).")
@handle_errors
@_exit_2
def optimize_model(name: str, new_name: str | None, quantize: str | None, threads: int | None,
                   force: bool) -> None:
    """Write and register a copy of NAME (a registry name or a .gguf path) whose Q6_K
    tensors are re-laid as Q8_0.

    On x86 llama.cpp repacks Q4_K weights for batched passes but has no repacked kernel
    for Q6_K; Q8_0 batches go through llamafile's tinyBLAS, so verify passes of several
    tokens may cost fewer plain steps (docs/benchmarks.md, "Why the verify curve bends";
    `edgespec plan` shows the predicted gain once both are calibrated). The copy is larger
    and its weights are requantized (docs/models.md says by how much it differs). It goes
    to $EDGESPEC_HOME/models/NEW.gguf and into your registry as model NEW, with its own
    sha256 and the source's; `edgespec models verify NEW` says when the source changed.
    """
    from ..registry import optimize  # deferred: gguf and the quantizer only where asked

    made = optimize.optimize(name, name=new_name, quantize=quantize, threads=threads,
                             force=force, progress=_progress)
    new = made.spec.name
    n = len(made.changed)
    shown = ", ".join(made.changed[:4]) + (f", ... ({n - 4} more)" if n > 4 else "")
    click.echo(f"re-laid {n} Q6_K tensor{'s' if n != 1 else ''} as Q8_0: {shown}")
    click.echo(f"size {_human(made.size_before)} -> {_human(made.size_after)}")
    click.echo(f"{'remade' if made.replaced else 'registered'} {new}\t{made.spec.path}\t"
               f"{made.spec.sha256}")
    if made.pairs:
        click.echo(f"pairs as {made.source}'s: {', '.join(made.pairs)}")
    click.echo(f"next: `edgespec plan --target {new} --calibrate` predicts its speed beside "
               f"{made.source}'s; `edgespec generate --target {new} ...` runs it")


@models.command("path")
@click.argument("name")
@click.option("--no-pull", is_flag=True, help="Fail instead of pulling a missing model.")
@handle_errors
def model_path(name: str, no_pull: bool) -> None:
    """Print the local path of NAME (a registry name or a .gguf path), pulling it if needed."""
    click.echo(str(registry.resolve(name, pull=not no_pull, progress=_progress)))


@models.command("scan")
@click.option("--source", "sources", multiple=True, type=click.Choice(refs.SCHEMES),
              help="Scan only this store (repeatable); default all of them.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@handle_errors
def scan_models(sources: tuple[str, ...], as_json: bool) -> None:
    """GGUF models other tools keep on disk: the Hugging Face cache, LM Studio, ollama and
    llama.cpp's cache (docs/models.md says where each is looked for).

    NAME works wherever a model name does (`--target ollama:qwen2.5-coder:7b`), or pin it
    in your registry with `edgespec models add MYNAME NAME`. Headers are read, nothing is
    hashed; a file that is not GGUF, is truncated or is missing is listed as unusable with
    the reason.
    """
    result = scan.scan(sources or None)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    usable = [m for m in result.models if m.usable]
    header = ("NAME", "SIZE", "ARCH", "QUANT", "VOCAB", "PATH")
    table = [header] + [(m.name, _human(m.size), m.architecture or "?", m.quant or "?",
                         str(m.vocab_size or "?"), str(m.path)) for m in usable]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table if usable else ():
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if not usable:
        click.echo("no usable GGUF models found")
    broken = [m for m in result.models if not m.usable]
    if broken:
        click.echo("\nUNUSABLE")
        for m in broken:
            click.echo(f"{m.name}  {m.problem}")
    click.echo("\nSTORES")
    sw = max(len(s.source) for s in result.stores)
    rw = max(len(str(s.root)) for s in result.stores)
    for s in result.stores:
        count = sum(1 for m in result.models if m.source == s.source
                    and (m.path == s.root or s.root in m.path.parents))
        state = f"{count} model{'s' if count != 1 else ''}" if s.present else \
            f"absent (set {s.env} to move it)"
        click.echo(f"{s.source.ljust(sw)}  {str(s.root).ljust(rw)}  {state}")
        for note in s.notes:
            click.echo(f"{''.ljust(sw)}  note: {note}")
