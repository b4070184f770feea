"""`edgespec parity`: plain vs each speculative configuration, per-configuration report."""
from __future__ import annotations

import json

import click

from .common import handle_errors
from .options import THREADS, finite
from ..errors import InvalidInputError
from ..api.params import SamplingParams

#: the configurations run when --proposers is not given (any registered proposer may be asked)
CONFIGS = ("draft", "ngram", "suffix")


@click.command("parity")
@click.option("--target", default="qwen-1.5b", show_default=True, help="Registry name or .gguf path.")
@click.option("--draft", default=None, help="Draft model; adds the 'draft' configuration.")
@click.option("--proposers", default=None,
              help="Comma-separated registered proposers to compare with the plain path, "
                   "asked-only ones (self, lookahead, mtp) included "
                   "(default: draft if --draft is given, plus ngram and suffix).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="JSONL with a 'prompt' or 'turns' field (default: Spec-Bench, all 13 categories).")
@click.option("--per-category", type=click.IntRange(1), default=1, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="At most this many prompts.")
@click.option("--mode", type=click.Choice(["greedy", "sampling", "both"]), default="greedy",
              show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True,
              help="Greedy generation length.")
@click.option("--exact/--no-exact", default=True, show_default=True,
              help="The engine's exact mode (verify passes short enough to be batch-invariant), "
                   "or approximate mode (longer drafts, near-ties may flip).")
@click.option("--max-draft", type=click.IntRange(1, 64), default=None,
              help="Fixed draft length, adaptive control off so every configuration drafts "
                   "(default: the most exact mode allows, else 4).")
@click.option("--tolerance", type=click.FloatRange(0.0), default=None,
              help="Largest per-logit batch effect still called numerical drift "
                   "(default 0 with --exact: any divergence is a defect; 0.6, the measured "
                   "maximum, with --no-exact).")
@click.option("--temperature", type=finite(0.0, min_open=True), default=0.8, show_default=True)
@click.option("--top-k", type=click.IntRange(0), default=0)
@click.option("--top-p", type=finite(0.0, 1.0, min_open=True), default=1.0)
@click.option("--min-p", type=finite(0.0, 1.0, max_open=True), default=0.0)
@click.option("--seeds", type=click.IntRange(10), default=100, show_default=True,
              help="Sampling runs per prompt and path.")
@click.option("--positions", type=click.IntRange(1), default=4, show_default=True,
              help="Sampled tokens compared per run.")
@click.option("--alpha", type=click.FloatRange(0.0, 1.0, min_open=True), default=1e-3, show_default=True,
              help="False-alarm rate per configuration (Bonferroni over its tests).")
@click.option("--self-check", is_flag=True,
              help="Also run the first configuration with deliberately broken acceptance "
                   "(no residual); the report must flag it.")
@click.option("--ctx", "n_ctx", type=click.IntRange(64), default=None)
@click.option("--threads", type=THREADS, default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the full report as JSON here.")
@handle_errors
def parity(target, draft, proposers, prompts_file, per_category, limit, mode, max_tokens, exact,
           max_draft, tolerance, temperature, top_k, top_p, min_p, seeds, positions, alpha, self_check, n_ctx,
           threads, json_path):
    """Run prompts through the plain path and each speculative configuration; report divergences."""
    from ..lab.analysis import parity as P  # deferred: `edgespec` starts without what other commands need

    configs = _configs(proposers, draft)
    prompts = P.load_prompts(prompts_file, per_category=per_category, limit=limit)
    if tolerance is None:
        tolerance = 0.0 if exact else P.DEFAULT_TOLERANCE
    tol = tolerance
    from ..engine.engine import Engine  # deferred: it loads llama.cpp

    if max_draft is None and not exact:
        max_draft = 4
    # in exact mode without --max-draft the engine drafts the most its probed cap allows
    # every configuration in the label: an asked-only proposer is built only when named
    engine = Engine.load(target, draft=draft, proposer=_label(configs), n_ctx=n_ctx, threads=threads,
                         max_draft=max_draft, adaptive=False, exact=exact)
    max_draft = engine.control.max_draft
    reports = {c: P.ConfigReport(c, alpha=alpha) for c in configs}
    try:
        click.echo(f"parity: {len(prompts)} prompts x {len(configs)} configurations on {target}, "
                   f"{'exact' if exact else 'approximate'} mode, draft length {max_draft}", err=True)
        if mode in ("greedy", "both"):
            for out in P.greedy_parity(engine, prompts, configs, max_tokens=max_tokens, tolerance=tol):
                reports[out.config].greedy.append(out)
                click.echo(f"  greedy {out.config:7s} {out.category:15s} {_greedy_word(out)}", err=True)
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p).validate()
        if mode in ("sampling", "both"):
            for out in P.sampling_parity(engine, prompts, configs, sp, n_seeds=seeds, positions=positions):
                reports[out.config].sampling.append(out)
                click.echo(f"  sampling {out.config:7s} {out.category:15s} min p {min(out.p_values):.3g}",
                           err=True)
        if self_check:
            broken = P.ConfigReport(f"{configs[0]}+broken", alpha=alpha)
            with P.broken_acceptance():
                broken.sampling.extend(P.sampling_parity(engine, prompts, [configs[0]], sp,
                                                         n_seeds=seeds, positions=positions))
            reports[broken.config] = broken
    finally:
        engine.close()

    click.echo(_table(reports.values(), tol))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"target": target, "draft": draft, "exact": exact, "tolerance": tol,
                       "max_draft": max_draft,
                       "reports": [r.to_json() for r in reports.values()]}, f, indent=2)


def _configs(proposers: str | None, draft: str | None) -> list[str]:
    """The configurations to compare: registered proposer names, checked (an unknown one
    is an error listing the registered ones; draft models need --draft)."""
    from .. import proposers as registry  # deferred: `edgespec` starts without the registry
    if proposers is None:
        return ([("draft")] if draft else []) + ["ngram", "suffix"]
    names = list(dict.fromkeys(p.strip() for p in proposers.split(",") if p.strip()))
    bad = [p for p in names if p not in registry.REGISTRY]
    if bad or not names:
        raise InvalidInputError(f"--proposers takes a comma-separated list of registered "
                                f"proposers: {', '.join(registry.REGISTRY)} (got {proposers!r}"
                                + (f"; unknown: {', '.join(bad)})" if bad else ")"))
    needing = [p for p in names if registry.needs_model(p)]
    if needing and not draft:
        raise InvalidInputError(f"the {needing[0]!r} configuration needs --draft NAME|PATH")
    return names


def _label(configs: list[str]) -> str:
    """The engine's proposer label: the first configuration, plus every other one that is
    built only when asked for (self, lookahead, mtp) so that it is loaded too."""
    from .. import proposers as registry  # deferred: see _configs
    asked = [c for c in configs[1:] if registry.REGISTRY[c].asked_only]
    return "+".join([configs[0], *asked])


def _greedy_word(out) -> str:
    if out.identical:
        exact = "bitwise" if out.bitwise else f"logprobs differ by up to {out.max_logprob_diff:.3g}"
        return f"identical, {exact} ({out.n_plain} tokens, {out.accepted}/{out.drafted} accepted)"
    d = out.divergence
    if d is None:
        return f"lengths differ ({out.n_plain} vs {out.n_spec} tokens)"
    return (f"{d.kind.upper()} at token {d.position}: {d.plain_token} vs {d.spec_token}, "
            f"margins {d.plain_margin:.3f} / {d.spec_margin:.3f}, shift {d.pair_shift:.3f}"
            f"{' (bound)' if d.bounded else ''}")


def _table(reports, tol: float) -> str:
    lines = [f"{'configuration':18s} {'greedy: same':>12s} {'bitwise':>8s} {'drift':>6s} {'defect':>7s}"
             "   sampling", "-" * 80]
    for r in reports:
        c = r.counts()
        if r.sampling_ok is None:
            samp = "-"
        else:
            samp = (f"{'pass' if r.sampling_ok else 'FAIL'} (min p {r.min_p:.2g} over {r.n_tests} tests, "
                    f"alpha {r.alpha:g})")
        greedy = (f"{c['identical']:>12d} {c['bitwise']:>8d} {c['drift']:>6d} {c['defect'] + c['length']:>7d}"
                  if r.greedy else f"{'-':>12s} {'-':>8s} {'-':>6s} {'-':>7s}")
        lines.append(f"{r.config:18s} {greedy}   {samp}")
    lines.append("(same: identical tokens; bitwise: and identical logprobs at every emitted token; "
                 f"drift: the two diverging tokens moved by <= 2 x {tol:g} logits relative to each other)")
    return "\n".join(lines)
