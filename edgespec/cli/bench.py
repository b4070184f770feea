"""`edgespec bench` and `edgespec qualify`: thin adapters over edgespec.bench."""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from .common import handle_errors
from ..errors import InvalidInputError

DEFAULT_OUT = Path("bench-out")


def _out_dir(out: str | None, name: str) -> Path:
    return Path(out) if out else DEFAULT_OUT / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InvalidInputError(f"{what} must be comma-separated whole numbers (got {text!r})") from None


class _Progress:
    """Progress with ETA on stderr: a click bar on a terminal, one line per request in a log."""

    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.bar = None
        if self.tty:
            self.bar = click.progressbar(length=total, label=label, file=sys.stderr, show_eta=True,
                                         show_pos=True, item_show_func=self._item)
            self.bar.__enter__()

    @staticmethod
    def _item(rec) -> str | None:
        if rec is None:
            return "warm-up"
        if "error" in rec:
            return f"{rec['config']} {rec['prompt_id']}: error"
        return f"{rec['config']} {rec['category']} {rec['decode_tokens_per_second']:.1f} tok/s"

    def __call__(self, done: int, total: int, rec) -> None:
        if self.bar is not None:
            self.bar.update(1, rec)
            return
        elapsed = time.monotonic() - self.t0
        eta = elapsed / done * (total - done) if done else 0.0
        click.echo(f"[{done}/{total}] {self._item(rec)}; elapsed {elapsed / 60:.1f} min, "
                   f"ETA {eta / 60:.1f} min", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def run_and_write(m, out_dir: Path, label: str):
    """Run the matrix with a progress bar; always write JSON + report (also after Ctrl-C)."""
    from ..bench.report import write_json, write_report
    from ..bench.runner import collect_prompts, run_bench, total_requests

    m = m.validate()
    prompts = collect_prompts(m)
    total = total_requests(m, prompts)
    click.echo(f"{label}: {len(prompts)} prompts, {len(m.configs)} configurations "
               f"({', '.join(m.labels)}), {total} requests; loading {m.target}…", err=True)
    progress = None
    try:
        progress = _Progress(total, label)
        run = run_bench(m, progress=progress, prompts=prompts)
    finally:
        if progress is not None:
            progress.close()
    data = run.to_dict()
    json_path = write_json(data, out_dir / "bench.json")
    report_path = write_report(data, out_dir)
    return run, data, json_path, report_path


def _echo_overall(data) -> None:
    from ..bench.report import OVERALL, speedup_table

    table = speedup_table(data)
    for config, cell in table.get(OVERALL, {}).items():
        iv = cell.decode
        if iv.n:
            click.echo(f"  {config}: {iv.estimate:.2f}× decode [{iv.low:.2f}, {iv.high:.2f}], "
                       f"{cell.e2e.estimate:.2f}× end to end (n={iv.n})")


@click.command("bench")
@click.option("--preset", type=click.Choice(["quick", "full"]), default="quick", show_default=True,
              help="quick: 1 prompt per category, 64 tokens (~10 min, 2 cores, Qwen 1.5B); full: more.")
@click.option("--config", "matrix_file", type=click.Path(dir_okay=False),
              help="TOML matrix file (see docs/bench.md); flags below override it.")
@click.option("--target", default=None, help="Registry name or .gguf path [default: qwen-1.5b].")
@click.option("--draft", default=None, help="Draft model, needed by the 'draft' proposer.")
@click.option("--proposer", "proposers", multiple=True, metavar="NAME[:KNOB=V,...]",
              help="A configuration (repeatable; replaces the preset's). The plain path is always "
                   "included. Knobs: proposer options, or draft_len/adaptive for the engine.")
@click.option("--anchor", "anchors", multiple=True, type=click.IntRange(1), metavar="N",
              help="llama-cpp-python's LlamaPromptLookupDecoding with num_pred_tokens=N (repeatable).")
@click.option("--no-anchor", is_flag=True, help="Leave llama-cpp-python's prompt lookup out.")
@click.option("--categories", default=None, help="Spec-Bench categories: all, none, or a,b,c.")
@click.option("--per-category", type=click.IntRange(1), default=None, help="Prompts per category.")
@click.option("--turns", "max_turns", type=click.IntRange(1), default=None,
              help="At most this many turns of multi-turn prompts.")
@click.option("--humanevalfix", type=click.IntRange(0), default=None, help="HumanEvalFix prompts.")
@click.option("--jsonl", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Any JSONL prompt file (repeatable).")
@click.option("--prompt-field", default=None, help="Field of --jsonl records holding the prompt.")
@click.option("--limit", "jsonl_n", type=click.IntRange(1), default=None,
              help="At most this many records per --jsonl file.")
@click.option("--buckets", default=None, help="Prompt-length bucket edges in tokens, e.g. 256,1024.")
@click.option("--max-tokens", type=click.IntRange(1), default=None)
@click.option("--temperature", type=click.FloatRange(0.0), default=None, help="0 = greedy.")
@click.option("--seed", type=int, default=None)
@click.option("--threads", type=click.IntRange(1), default=None)
@click.option("--ctx", "n_ctx", type=click.IntRange(64), default=None)
@click.option("--warmup", type=click.IntRange(0), default=None, help="Discarded requests per config.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output folder [default: bench-out/<time>-<preset>].")
@click.option("--report-from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Rebuild report.md and the plots from a saved bench.json; run nothing.")
@click.option("--dry-run", is_flag=True, help="Print the matrix and the request count; run nothing.")
@handle_errors
def bench(preset, matrix_file, target, draft, proposers, anchors, no_anchor, categories,
          per_category, max_turns, humanevalfix, jsonl, prompt_field, jsonl_n, buckets, max_tokens,
          temperature, seed, threads, n_ctx, warmup, out, report_from, dry_run):
    """Benchmark the plain path, proposers and llama-cpp-python's prompt lookup side by side."""
    from ..bench import matrix as mx

    if report_from:
        from ..bench.report import load_run, write_report

        data = load_run(report_from)
        path = write_report(data, Path(out) if out else Path(report_from).parent)
        click.echo(f"report: {path}")
        return
    m = mx.load_toml(matrix_file, base=mx.preset(preset)) if matrix_file else mx.preset(preset)
    changes = {k: v for k, v in dict(
        target=target, draft=draft, per_category=per_category, max_turns=max_turns,
        humanevalfix=humanevalfix, prompt_field=prompt_field, jsonl_n=jsonl_n,
        max_new_tokens=max_tokens, temperature=temperature, seed=seed, threads=threads,
        n_ctx=n_ctx, warmup=warmup).items() if v is not None}
    if categories is not None:
        changes["spec_bench"] = mx.spec_bench_selection(categories)
    if jsonl:
        changes["jsonl"] = tuple(jsonl)
    if buckets is not None:
        changes["buckets"] = _ints(buckets, "--buckets")
    m = replace(m, **changes)
    preset_engine = [c for c in mx.preset(preset).configs if c.kind == "engine"]
    engine_configs = ([mx.parse_config(p) for p in proposers] if proposers
                      else [c for c in m.configs if c.kind == "engine"])
    if engine_configs == preset_engine and m.draft is None:
        # The preset lists "draft" for when a draft model is given; without one, leave it out.
        engine_configs = [c for c in engine_configs if c.proposer != "draft"]
    anchor_configs = ([] if no_anchor else [mx.ConfigSpec.anchor(n) for n in anchors] if anchors
                      else [c for c in m.configs if c.kind == mx.ANCHOR_KIND])
    m = replace(m, configs=tuple(engine_configs) + tuple(anchor_configs))
    if matrix_file or changes or proposers or anchors or no_anchor:
        m = replace(m, preset=f"{m.preset}, modified")
    m = m.with_baseline().validate()
    if dry_run:
        from ..bench.runner import collect_prompts, total_requests

        prompts = collect_prompts(m)
        click.echo(f"target {m.target}, draft {m.draft or '-'}; configurations: {', '.join(m.labels)}")
        click.echo(f"{len(prompts)} prompts ({sum(len(p.turns) for p in prompts)} turns), "
                   f"{m.max_new_tokens} new tokens, temperature {m.temperature}; "
                   f"{total_requests(m, prompts)} requests")
        return
    out_dir = _out_dir(out, preset)
    run, data, json_path, report_path = run_and_write(m, out_dir, "bench")
    click.echo(f"wrote {json_path} and {report_path}")
    _echo_overall(data)
    if run.interrupted:
        click.echo("interrupted: the files hold what was measured before Ctrl-C", err=True)
        sys.exit(130)


@click.command("qualify")
@click.argument("target")
@click.argument("proposer")
@click.option("--slices", default="summarization,coding,humanevalfix", show_default=True,
              help="Workload slices: Spec-Bench categories and/or humanevalfix, comma-separated.")
@click.option("--per-slice", type=click.IntRange(1), default=3, show_default=True,
              help="Prompts per slice.")
@click.option("--turns", "max_turns", type=click.IntRange(1), default=1, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=None)
@click.option("--ctx", "n_ctx", type=click.IntRange(64), default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Where the evidence (bench.json, report.md) goes [default: bench-out/<time>-qualify].")
@handle_errors
def qualify(target, proposer, slices, per_slice, max_turns, max_tokens, threads, n_ctx, seed, out):
    """Measure a registered TARGET–PROPOSER pair per slice and record it for automatic choices.

    PROPOSER: ngram, suffix, draft, or draft:NAME / a draft model's name.
    """
    from .. import registry
    from ..bench import matrix as mx
    from ..bench.prompts import HUMANEVALFIX, SPEC_BENCH_CATEGORIES
    from ..bench.report import slice_results

    pair = registry.load_registry().pair(target, proposer)
    names = [s.strip() for s in slices.split(",") if s.strip()]
    unknown = [s for s in names if s not in SPEC_BENCH_CATEGORIES and s != HUMANEVALFIX]
    if not names or unknown:
        raise InvalidInputError(f"unknown slice(s) {', '.join(unknown) or '(none given)'}; choose from "
                                f"{', '.join((*SPEC_BENCH_CATEGORIES, HUMANEVALFIX))}")
    config = mx.ConfigSpec(pair.proposer)
    m = mx.Matrix(
        target=pair.target, draft=pair.draft, configs=(mx.ConfigSpec(mx.BASELINE), config),
        spec_bench=tuple(s for s in names if s != HUMANEVALFIX), per_category=per_slice,
        max_turns=max_turns, humanevalfix=per_slice if HUMANEVALFIX in names else 0,
        max_new_tokens=max_tokens, seed=seed, threads=threads,
        n_ctx=n_ctx or mx.Matrix.n_ctx, preset="qualify").validate()
    out_dir = _out_dir(out, "qualify")
    run, data, json_path, report_path = run_and_write(m, out_dir, f"qualify {pair.target}+{pair.key}")
    if run.interrupted:
        click.echo(f"interrupted: nothing recorded; partial evidence in {json_path}", err=True)
        sys.exit(130)
    results = slice_results(data, config.label)
    ident = data["identity"]
    stamp = {
        "measured_at": ident.get("date"),
        "edgespec_commit": ident.get("edgespec", {}).get("commit"),
        "llama_cpp_python": ident.get("llama_cpp", {}).get("llama_cpp_python"),
        "cpu_model": ident.get("machine", {}).get("cpu_model"),
        "threads": ident.get("engine", {}).get("threads"),
        "max_new_tokens": m.max_new_tokens,
        "temperature": m.temperature,
        "evidence": str(json_path),
    }
    missing = [s for s in names if s not in results]
    if missing:
        click.echo(f"no paired measurements for {', '.join(missing)} (see {report_path}); "
                   "those slices are not recorded", err=True)
    path = registry.record_qualification(pair.target, pair.key,
                                         {s: {**r, **stamp} for s, r in results.items()})
    for s, r in results.items():
        low = r["speedup_ci_low"]
        click.echo(f"  {s}: acceptance {r['acceptance_rate'] or 0:.0%}, accepted length "
                   f"{r['mean_accepted_length'] or 0:.2f}, speedup {r['speedup'] or 0:.2f}× "
                   f"(lower bound {low if low is not None else float('nan'):.2f}, n={r['n']})")
    click.echo(f"recorded {len(results)} slice(s) for {pair.target} + {pair.key} in {path}; "
               f"evidence: {report_path}")
