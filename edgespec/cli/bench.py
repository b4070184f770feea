"""`edgespec bench` and `edgespec qualify`: thin adapters over edgespec.lab.bench."""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from .common import handle_errors
from .options import THREADS, finite
from .extras import require

DEFAULT_OUT = Path("bench-out")


def _out_dir(out: str | None, name: str) -> Path:
    return Path(out) if out else DEFAULT_OUT / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


class _Progress:
    """Progress on stderr: a bar on a terminal, one line per request in a log, with an ETA
    from each configuration's own measured mean request time (configurations differ by
    several times, so one global rate drifts as the rotation moves)."""

    def __init__(self, total: int, label: str, configs: int = 1, warmup: int = 0) -> None:
        self.total = total
        self.configs = max(1, configs)
        self.per_config = max(0, (total - warmup * self.configs) // self.configs)
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.seconds: dict[str, list[float]] = {}  # config -> [requests, seconds]
        self.bar = None
        if self.tty:
            self.bar = click.progressbar(length=total, label=label, file=sys.stderr,
                                         show_eta=False, show_pos=True,
                                         item_show_func=self._item)
            self.bar.__enter__()

    def eta(self) -> float | None:
        """Seconds left: each configuration's remaining requests at its own mean time (a
        configuration not measured yet at the mean of the others); None before any."""
        means = {c: t / n for c, (n, t) in self.seconds.items() if n}
        if not means:
            return None
        fallback = sum(means.values()) / len(means)
        left = 0.0
        for c in set(means) | {f"?{i}" for i in range(self.configs - len(means))}:
            done = self.seconds.get(c, [0, 0.0])[0]
            left += max(self.per_config - done, 0) * means.get(c, fallback)
        return left

    def _item(self, rec) -> str | None:
        if rec is None:
            return "warm-up"
        eta = self.eta()
        tail = f" · ETA {eta / 60:.1f} min" if eta is not None else ""
        if "error" in rec:
            return f"{rec['config']} {rec['prompt_id']}: error{tail}"
        return f"{rec['config']} {rec['category']} {rec['decode_tokens_per_second']:.1f} tok/s{tail}"

    def __call__(self, done: int, total: int, rec) -> None:
        if rec is not None and "wall_seconds" in rec:
            cell = self.seconds.setdefault(rec["config"], [0, 0.0])
            cell[0] += 1
            cell[1] += rec["wall_seconds"]
        if self.bar is not None:
            self.bar.update(1, rec)
            return
        elapsed = time.monotonic() - self.t0
        click.echo(f"[{done}/{total}] {self._item(rec)}; elapsed {elapsed / 60:.1f} min",
                   err=True)

    def say(self, line: str) -> None:
        """A line of its own (a warning) without breaking the bar."""
        if self.bar is not None:
            click.echo("", err=True)
        click.echo(f"edgespec: {line}", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def run_and_write(m, out_dir: Path, label: str):
    """Run the matrix with a progress bar; always write JSON + report (also after Ctrl-C)."""
    from ..lab.bench.report import write_report  # deferred: `edgespec` starts without what other commands need
    from ..lab.bench.results import write_json  # deferred: `edgespec` starts without what other commands need
    from ..lab.bench.runner import collect_prompts, run_bench, total_requests  # deferred: `edgespec` starts without what other commands need

    from ..lab.bench.records import RecordSink  # deferred: `edgespec` starts without what other commands need

    m = m.validate()
    prompts = collect_prompts(m)
    total = total_requests(m, prompts)
    click.echo(f"{label}: {len(prompts)} prompts, {len(m.configs)} configurations "
               f"({', '.join(m.labels)}), {total} requests; loading {m.target}…", err=True)
    progress = None
    sink = RecordSink(out_dir / "records.jsonl")  # every full record, as its unit ends
    try:
        progress = _Progress(total, label, len(m.configs), m.warmup if prompts else 0)
        run = run_bench(m, progress=progress, prompts=prompts, sink=sink.write, warn=progress.say)
    finally:
        sink.close()
        if progress is not None:
            progress.close()
    data = run.to_dict()
    say = (lambda line: click.echo(f"edgespec: {line}", err=True))
    say(f"writing {out_dir / 'bench.json'} ({len(data['records'])} records)")
    json_path = write_json(data, out_dir / "bench.json", records_from=sink.path)
    sink.path.unlink(missing_ok=True)  # its records are all in bench.json now
    report_path = write_report(data, out_dir, say=say)
    lines = run.trace_lines()
    if lines:
        import json  # deferred: `edgespec` starts without what other commands need
        with open(out_dir / "traces.jsonl", "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        click.echo(f"recorded {len(lines) - 1} requests' passes in {out_dir / 'traces.jsonl'}; "
                   f"replay them with `edgespec bench --replay {out_dir}`", err=True)
    return run, data, json_path, report_path


def _echo_busy(data) -> None:
    from ..lab.bench.report import busy_warning  # deferred: `edgespec` starts without what other commands need
    said = busy_warning(data)
    if said:
        click.echo(f"edgespec: warning: {said}", err=True)


def _echo_overall(data) -> None:
    from ..lab.bench.results import OVERALL, PLAIN_LLAMA, speedup_table, vs_llama_table  # deferred: `edgespec` starts without what other commands need

    table = speedup_table(data)
    for config, cell in table.get(OVERALL, {}).items():
        iv = cell.decode
        if iv.n:
            click.echo(f"  {config}: {iv.estimate:.2f}× decode [{iv.low:.2f}, {iv.high:.2f}], "
                       f"{cell.e2e.estimate:.2f}× end to end (n={iv.n})")
    vs = vs_llama_table(data).get(OVERALL, {})
    if vs:
        click.echo(f"against {PLAIN_LLAMA} (decode, geometric mean):")
        for config, cell in vs.items():
            if cell.decode.n:
                iv = cell.decode
                click.echo(f"  {config}: {iv.estimate:.2f}× [{iv.low:.2f}, {iv.high:.2f}]")


@click.command("bench")
@click.option("--preset", type=click.Choice(["quick", "standard", "long", "full", "grounded",
                                             "grounded-quick"]), default="quick",
              show_default=True,
              help="quick: 1 prompt per category, 64 tokens (~10 min, 2 cores, Qwen 1.5B); standard: "
                   "3 per category + 10 HumanEvalFix, 128 tokens, llama.cpp anchors (~1 h); long: "
                   "2k/4k/8k-token grounded prompts; full: more (hours); grounded: edits of Python "
                   "stdlib sources, one-shot and multi-turn, with oracles and llama.cpp anchors; "
                   "grounded-quick: 3 of those prompts.")
@click.option("--config", "matrix_file", type=click.Path(dir_okay=False),
              help="TOML matrix file (see docs/bench.md); flags below override it.")
@click.option("--target", default=None, help="Registry name or .gguf path [default: qwen-1.5b].")
@click.option("--draft", default=None, help="Draft model, needed by the 'draft' proposer.")
@click.option("--proposer", "proposers", multiple=True, metavar="NAME[:KNOB=V,...]",
              help="A configuration (repeatable; replaces the preset's). The plain path is always "
                   "included; 'auto' is the engine's default. Knobs: proposer options, or "
                   "max_draft/adaptive/exact for the engine.")
@click.option("--anchor", "anchors", multiple=True, metavar="NAME[:N]",
              help="Another implementation on the same prompts (repeatable): llama-completion, "
                   "llama-lookup[:N], llama-speculative-simple[:N] (built by `make anchors`), "
                   "llama-pld[:N] (llama-cpp-python's prompt lookup, N tokens, default 10).")
@click.option("--no-anchor", is_flag=True, help="Leave the preset's anchors out.")
@click.option("--categories", default=None, help="Spec-Bench categories: all, none, or a,b,c.")
@click.option("--per-category", type=click.IntRange(1), default=None, help="Prompts per category.")
@click.option("--turns", "max_turns", type=click.IntRange(1), default=None,
              help="At most this many turns of multi-turn prompts.")
@click.option("--humanevalfix", type=click.IntRange(0), default=None, help="HumanEvalFix prompts.")
@click.option("--grounded", "grounded_set", type=click.Choice(["all", "quick", "edits"]),
              default=None, help="Grounded stdlib prompts: all, quick (3 of them) or edits (the "
                                 "code edits alone) [default: the preset's].")
@click.option("--long", "long_", default=None, metavar="N,N,...",
              help="Grounded long prompts of about these many tokens (e.g. 2048,4096; '' for none).")
@click.option("--jsonl", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Any JSONL prompt file (repeatable).")
@click.option("--prompt-field", default=None, help="Field of --jsonl records holding the prompt.")
@click.option("--limit", "jsonl_n", type=click.IntRange(1), default=None,
              help="At most this many records per --jsonl file.")
@click.option("--buckets", default=None, help="Prompt-length bucket edges in tokens, e.g. 256,1024.")
@click.option("--max-tokens", type=click.IntRange(1), default=None)
@click.option("--temperature", type=finite(0.0), default=None, help="0 = greedy.")
@click.option("--seed", type=int, default=None)
@click.option("--threads", type=THREADS, default=None)
@click.option("--ctx", "n_ctx", type=click.IntRange(64), default=None)
@click.option("--warmup", type=click.IntRange(0), default=None, help="Discarded requests per config.")
@click.option("--repeats", type=click.IntRange(1), default=None,
              help="Rounds over the prompt set: each prompt measured this many times, a round "
                   "at a time (per-prompt ratios then rest on several paired samples).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: bench-out/<time>-<preset>].")
@click.option("--report-from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Rebuild report.md and the plots from a saved bench.json; run nothing.")
@click.option("--dry-run", is_flag=True, help="Print the matrix and the request count; run nothing.")
@click.option("--record", is_flag=True, default=None,
              help="Also keep every engine request's passes (drafts, decisions, timings) and "
                   "the pass-time curve at this run's context depths, in traces.jsonl, for --replay.")
@click.option("--replay", "replay_dir", type=click.Path(exists=True), default=None,
              metavar="RUN_DIR",
              help="Replay a --record run's passes through the same controllers on its own "
                   "cost curves and print predicted vs measured speedups; run nothing.")
@handle_errors
def bench(preset, matrix_file, target, draft, proposers, anchors, no_anchor, categories,
          per_category, max_turns, humanevalfix, grounded_set, long_, jsonl, prompt_field, jsonl_n,
          buckets, max_tokens, temperature, seed, threads, n_ctx, warmup, repeats, out,
          report_from, dry_run, record, replay_dir):
    """Benchmark the plain path, proposers and anchors (llama.cpp, llama-cpp-python) side by side."""
    if replay_dir:
        _replay(Path(replay_dir), out)
        return
    if not dry_run:  # the report's plots need matplotlib; a dry run draws none
        require("bench", "bench")
    from ..lab.bench.compose import Flags, compose  # deferred: `edgespec` starts without what other commands need

    if report_from:
        from ..lab.bench.report import write_report  # deferred: `edgespec` starts without what other commands need
        from ..lab.bench.results import load_run  # deferred: `edgespec` starts without what other commands need

        data = load_run(report_from)
        path = write_report(data, Path(out) if out else Path(report_from).parent)
        click.echo(f"report: {path}")
        return
    m = compose(Flags(
        preset=preset, matrix_file=matrix_file, proposers=proposers, anchors=anchors,
        no_anchor=no_anchor, categories=categories, jsonl=jsonl, buckets=buckets, long=long_,
        scalars=tuple(dict(target=target, draft=draft, per_category=per_category,
                           max_turns=max_turns, humanevalfix=humanevalfix, grounded=grounded_set,
                           prompt_field=prompt_field, jsonl_n=jsonl_n, max_new_tokens=max_tokens,
                           temperature=temperature, seed=seed, threads=threads, n_ctx=n_ctx,
                           warmup=warmup, repeats=repeats).items())))
    if record:  # what the run keeps, not what it measures: the preset stays unmodified
        m = replace(m, record=True)
    if dry_run:
        from ..lab.bench.runner import collect_prompts, total_requests  # deferred: `edgespec` starts without what other commands need

        prompts = collect_prompts(m)
        if m.grounded:  # the stdlib texts this Python lacks or changed, said by name here too
            from ..lab.bench.grounded import build  # deferred: `edgespec` starts without what other commands need
            for skipped in build(m.grounded).skipped:
                click.echo(f"edgespec: {skipped.line()}", err=True)
        click.echo(f"target {m.target}, draft {m.draft or '-'}; configurations: {', '.join(m.labels)}")
        click.echo(f"{len(prompts)} prompts ({sum(len(p.turns) for p in prompts)} turns"
                   f"{f' x {m.repeats} rounds' if m.repeats > 1 else ''}), "
                   f"{m.max_new_tokens} new tokens, temperature {m.temperature}; "
                   f"{total_requests(m, prompts)} requests")
        return
    out_dir = _out_dir(out, preset)
    run, data, json_path, report_path = run_and_write(m, out_dir, "bench")
    click.echo(f"wrote {json_path} and {report_path}")
    _echo_overall(data)
    _echo_busy(data)
    if run.interrupted:
        click.echo("interrupted: the files hold what was measured before Ctrl-C", err=True)
        sys.exit(130)


def _replay(run_dir: Path, out: str | None) -> None:
    """`edgespec bench --replay RUN_DIR`: the comparison on stdout, replay.md and
    replay.json beside the traces (or in --out)."""
    import json  # deferred: `edgespec` starts without what other commands need

    from ..lab.replay import compare, load_traces  # deferred: `edgespec` starts without what other commands need
    from ..lab.replay.report import comparison_json, format_report  # deferred: `edgespec` starts without what other commands need

    run_dir = run_dir if run_dir.is_dir() else run_dir.parent
    traces = load_traces(run_dir)
    comp, over = compare(traces)
    text = format_report(comp, over, traces, run_dir)
    click.echo(text, nl=False)
    dest = Path(out) if out else run_dir
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "replay.md").write_text(text, encoding="utf-8")
    (dest / "replay.json").write_text(json.dumps(comparison_json(comp, over), indent=1),
                                      encoding="utf-8")
    click.echo(f"wrote {dest / 'replay.md'} and {dest / 'replay.json'}", err=True)


@click.command("qualify")
@click.argument("target")
@click.argument("proposer")
@click.option("--slices", default="summarization,coding,humanevalfix", show_default=True,
              help="Workload slices: Spec-Bench categories and/or humanevalfix, comma-separated.")
@click.option("--per-slice", type=click.IntRange(1), default=3, show_default=True,
              help="Prompts per slice.")
@click.option("--turns", "max_turns", type=click.IntRange(1), default=1, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--threads", type=THREADS, default=None)
@click.option("--ctx", "n_ctx", type=click.IntRange(64), default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Where the evidence (bench.json, report.md) goes [default: bench-out/<time>-qualify].")
@handle_errors
def qualify(target, proposer, slices, per_slice, max_turns, max_tokens, threads, n_ctx, seed, out):
    """Measure a TARGET–PROPOSER pair per slice and record it for automatic choices.

    TARGET: any model (a registry name, yours too, a .gguf path, an ollama:/hfcache:
    reference or a Hub reference). PROPOSER: ngram, suffix, draft (the target's registered
    draft), or draft:MODEL / a draft model's name. The records are kept by the sha256 of
    the files measured ($EDGESPEC_HOME/qualification.json): found again under any name for
    the same files, left out once a name points at another file.
    """
    require("bench", "qualify")  # its evidence report draws plots
    from .. import registry  # deferred: `edgespec` starts without what other commands need
    from ..lab.bench.compose import qualification_matrix  # deferred: `edgespec` starts without what other commands need
    from ..lab.bench.qualify import qualification_records  # deferred: `edgespec` starts without what other commands need

    from .. import statefile  # deferred: `edgespec` starts without what other commands need

    pair = registry.qualification_pair(target, proposer)
    m, names = qualification_matrix(pair, slices, per_slice=per_slice, max_turns=max_turns,
                                    max_tokens=max_tokens, seed=seed, threads=threads, n_ctx=n_ctx)
    out_dir = _out_dir(out, "qualify")
    # a long run whose results could not be written is refused before it starts
    statefile.check_writable(registry.qualification_paths()[1].parent,
                             what="qualification results")
    statefile.check_writable(out_dir, what="qualify evidence", need_bytes=1 << 20)
    run, data, json_path, report_path = run_and_write(m, out_dir, f"qualify {pair.target}+{pair.key}")
    if run.interrupted:
        click.echo(f"interrupted: nothing recorded; partial evidence in {json_path}", err=True)
        sys.exit(130)
    records = qualification_records(data, m.configs[1].label, m, str(json_path))
    missing = [s for s in names if s not in records]
    if missing:
        click.echo(f"no paired measurements for {', '.join(missing)} (see {report_path}); "
                   "those slices are not recorded", err=True)
    try:
        path = registry.record_qualification(pair.target, pair.key, records)
    except statefile.StateFileError as e:  # the disk filled during the run: say where it is
        raise statefile.StateFileError(f"{e}; the measurements are in {json_path}, run "
                                       "`edgespec qualify` again once there is space") from None
    _register_user_pair(pair)
    for s, r in records.items():
        low = r["speedup_ci_low"]
        click.echo(f"  {s}: acceptance {r['acceptance_rate'] or 0:.0%}, accepted length "
                   f"{r['mean_accepted_length'] or 0:.2f}, speedup {r['speedup'] or 0:.2f}× "
                   f"(lower bound {low if low is not None else float('nan'):.2f}, n={r['n']})")
    click.echo(f"recorded {len(records)} slice(s) for {pair.target} + {pair.key} in {path}; "
               f"evidence: {report_path}")


def _register_user_pair(pair) -> None:
    """A qualified pair of your own models that no registry lists yet goes into your
    registry, so `models list`, `export` and `--proposer auto` (which weighs a target's
    registered draft) find it."""
    from .. import registry  # deferred: `edgespec` starts without what other commands need
    from ..errors import ModelError  # deferred: `edgespec` starts without what other commands need
    from ..registry import user  # deferred: `edgespec` starts without what other commands need

    reg = registry.load_registry()
    names = [n for n in (pair.target, pair.draft) if n is not None]
    if pair.proposer == "bridge" or not all(n in reg.models for n in names) or all(reg.origin(n) == "shipped" for n in names):
        return
    try:
        added = user.add_pair(pair.target, pair.proposer, pair.draft)
    except ModelError as e:
        click.echo(f"not registered as a pair: {e}", err=True)
        return
    if added:
        click.echo(f"registered the pair {pair.target} + {pair.key} in {reg.user_path}",
                   err=True)
