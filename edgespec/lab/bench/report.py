"""The benchmark report: Markdown (report.md) and its PNG plots (plots), built from the
run's figures (results).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from .grounded import report_section as grounded_section
from .matrix import BASELINE
from .plots import render_plots
from .prompts import bucket_labels
from .results import (OVERALL, PLAIN_LLAMA, SpeedupCell, baselines, busy_warning, categories,
                      category_mean, config_labels, config_summary, divergences, ok_records,
                      pass_cost, pass_size_hist, speedup_cell, speedup_table, tree_summary,
                      unit_key, vs_llama_table)
from .stats import Interval, histogram_mean, median


# --- Markdown -------------------------------------------------------------------------
def _fmt_x(iv: Interval) -> str:
    if iv.n == 0 or math.isnan(iv.estimate):
        return "–"
    if iv.low == iv.high:
        return f"{iv.estimate:.2f}× (n={iv.n})"
    return f"{iv.estimate:.2f}× [{iv.low:.2f}, {iv.high:.2f}] (n={iv.n})"


def _ms(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x * 1000:.0f}"


def _pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.0%}"


def _f2(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.2f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _rounds(repeats: int) -> str:
    return (f", each measured in {repeats} rounds (ratios paired per round, intervals "
            "resampling prompts)" if repeats > 1 else "")


def render_markdown(run: Mapping, plots: Mapping[str, str] | None = None) -> str:
    m = run["matrix"]
    ident = run.get("identity", {})
    labels = config_labels(run)
    others = [c for c in labels if c != BASELINE]
    cats = categories(run)
    units = {unit_key(r) for r in run["records"]}
    lines = [f"# edgespec benchmark ({m.get('preset', 'custom')})", ""]
    if run.get("interrupted"):
        lines += ["**Interrupted**: the run was stopped early; these are the requests measured "
                  "before that.", ""]
    busy = busy_warning(run)
    if busy:
        lines += [f"**Warning**: {busy}", ""]
    es = ident.get("edgespec", {})
    mach = ident.get("machine", {})
    models = ident.get("models", {})
    eng = ident.get("engine", {})
    lines += ["## Run", ""]
    facts = [
        ("date", ident.get("date", "?")),
        ("command", " ".join(ident.get("argv", [])) or "?"),
        ("edgespec", f"{es.get('version', '?')} @ {str(es.get('commit'))[:12]}"
                     f"{' (uncommitted changes)' if es.get('dirty') else ''}"),
        ("llama-cpp-python", ident.get("llama_cpp", {}).get("llama_cpp_python", "?")),
        ("CPU", f"{mach.get('cpu_model', '?')}, {mach.get('cpus_physical', '?')} cores; "
                f"threads {eng.get('threads', m.get('threads'))}; load average at start "
                f"{', '.join(f'{x:.2f}' for x in mach.get('load_average') or []) or '?'}"),
    ]
    for role, info in models.items():
        facts.append((role, f"{info.get('name')} (sha256 {str(info.get('sha256'))[:16]}…)"))
    facts += [
        ("workload", f"{len(cats)} categories, {len({u[0] for u in units})} prompts, "
                     f"{len({u[:2] for u in units})} turns"
                     f"{_rounds(m.get('repeats', 1))}; {m['max_new_tokens']} new tokens; "
                     f"temperature {m['temperature']}"),
        ("configurations", ", ".join(labels)),
        ("engine", f"n_ctx {eng.get('n_ctx', m.get('n_ctx'))}, draft length {draft_length(run)}"),
        ("cold load", ", ".join(f"{k} {v:.2f} s" for k, v in run.get("load_seconds", {}).items())),
        ("warm-up", f"{run.get('warmup_discarded', 0)} requests discarded"),
    ]
    if run.get("load_rss_bytes"):
        facts.append(("memory at load", ", ".join(f"{k} +{v / 2**20:.0f} MiB" for k, v in
                                                   run["load_rss_bytes"].items())))
    lines += _table(("", ""), facts) + [""]
    lines += ["Per-request records and the full identity (llama.cpp system info included) are in "
              "the JSON file next to this report.", ""]

    lines += _vs_llama_section(run, cats)
    lines += grounded_section(run)
    if others:
        lines += _speedup_section(run, cats, others, m)
    lines += _acceptance_section(run, cats, labels)
    lines += _pass_size_section(run, cats, labels)
    lines += _tree_section(run, cats, labels)
    lines += _divergence_section(run)
    lines += _latency_section(run, labels)
    errors = [r for r in run["records"] if "error" in r]
    if errors:
        lines += ["## Errors", ""]
        lines += _table(("config", "prompt", "turn", "error"),
                        ((r["config"], r["prompt_id"], str(r["turn"]), r["error"].replace("|", "/"))
                         for r in errors))
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        for title, name in plots.items():
            lines += [f"### {title}", "", f"![{title}]({name})", ""]
    return "\n".join(lines)


def draft_length(run: Mapping) -> str:
    """The engine's draft cap (max_draft), and each configuration's own. A run recorded before
    the vocabulary settled (2026-12-05) names the cap draft_len, and fixed control's length
    draft_length: read, never written."""
    eng = run.get("identity", {}).get("engine", {})
    ctl = eng.get("control") or {}
    base = eng.get("max_draft", eng.get("draft_len"))
    if base is None:
        base = (ctl.get("max_draft") if ctl.get("adaptive")
                else ctl.get("draft_length", ctl.get("max_draft")))
    own = {label: k.get("max_draft", k.get("draft_len"))
           for label, k in (eng.get("control_knobs") or {}).items()
           if "max_draft" in k or "draft_len" in k}
    pinned = "max_draft" in eng or "draft_len" in eng
    text = "?" if base is None else (f"up to {base} (adaptive)" if ctl.get("adaptive")
                                     and not pinned else str(base))
    return text + "".join(f"; {label}: {n}" for label, n in own.items())


def _header(run, config: str) -> str:
    base = baselines(run).get(config, BASELINE)
    return config if base == BASELINE else f"{config} (vs {base})"


def _speedup_section(run, cats, others, m) -> list[str]:
    conf = int(round(m.get("confidence", 0.95) * 100))
    lines = ["## Speedup over the plain path", "",
             f"Decode tokens/s relative to the plain path on the same prompt and turn: per category "
             f"the median of the per-prompt ratios, over all prompts their geometric mean, each "
             f"with a [{conf}% bootstrap interval over prompts]; n = paired requests. One prompt "
             "gives no interval. An anchor is paired with its own plain path (named in its "
             "column's heading), so its ratio measures its speculation, not its runtime. End-to-end "
             "(prefill included) below.", ""]
    table = speedup_table(run, "category", cats)
    heads = [_header(run, c) for c in others]
    for title, attr in (("Decode", "decode"), ("End to end", "e2e")):
        lines += [f"### {title}", ""]
        rows = [(g, *(_fmt_x(getattr(table[g][c], attr)) for c in others))
                for g in [*cats, OVERALL] if g in table]
        if attr == "decode" and len(cats) > 1:
            rows.append(("mean of the category medians",
                         *(_f2(category_mean(table, c, cats)) + "×" for c in others)))
        lines += _table(("category", *heads), rows)
        lines.append("")
    lines += _plain_paths(run, m)
    buckets = bucket_labels(m.get("buckets", []))
    btable = speedup_table(run, "bucket", buckets)
    present = [b for b in buckets if b in btable]
    if present:
        lines += ["### By prompt length (tokens, as the plain path saw them)", "",
                  "Decode speedup (median), then for engine configurations the cost of one "
                  "verify pass in plain steps of the same prompt and the mean tokens per pass: "
                  "at long context attention's KV traffic changes what a pass costs.", ""]
        lines += _table(("bucket", *heads),
                        ((b, *(_bucket_cell(run, btable[b][c], c, b) for c in others))
                         for b in present))
        lines.append("")
    return lines


def _vs_llama_section(run, cats) -> list[str]:
    table = vs_llama_table(run, cats)
    if not table:
        return []
    configs = [c for c in config_labels(run) if c != PLAIN_LLAMA]
    lines = [f"## Against {PLAIN_LLAMA}", "",
             f"Decode tokens/s of every configuration relative to `{PLAIN_LLAMA}` (llama.cpp's "
             "plain decode, run with its own defaults: what a user would otherwise run) on the "
             "same prompt, in the same interleaved run: per category the median of the "
             "per-prompt ratios, over all prompts their geometric mean [bootstrap interval].", ""]
    rows = [(g, *(_fmt_x(table[g][c].decode) for c in configs))
            for g in [*cats, OVERALL] if g in table]
    if len(cats) > 1:
        rows.append(("mean of the category medians",
                     *(_f2(category_mean(table, c, cats)) + "×" for c in configs)))
        rows.append(("worst category median",
                     *(_f2(min((table[g][c].decode.estimate for g in cats
                                if g in table and table[g][c].decode.n), default=math.nan)) + "×"
                       for c in configs)))
    return lines + _table(("category", *configs), rows) + [""]


def _plain_paths(run, m) -> list[str]:
    """Our plain path against each anchor's plain path (llama.cpp's own decode)."""
    plains = [c["label"] for c in m["configs"] if c.get("kind") == "anchor"
              and c.get("baseline", BASELINE) == BASELINE]
    if not plains:
        return []
    recs = ok_records(run)
    kw = dict(resamples=m.get("bootstrap_resamples", 2000), confidence=m.get("confidence", 0.95),
              seed=m.get("seed", 0))
    lines = ["### Plain paths", "",
             "Our plain path's decode speed relative to each plain anchor on the same prompts "
             "(median over prompts): 1.00× means as fast as llama.cpp's own decode.", ""]
    rows = [(p, _fmt_x(speedup_cell(recs, BASELINE, baseline=p, statistic=median, **kw).decode))
            for p in plains]
    return lines + _table(("plain anchor", "our plain path ÷ anchor"), rows) + [""]


def _bucket_cell(run, cell: SpeedupCell, config: str, bucket: str) -> str:
    text = _fmt_x(cell.decode)
    if baselines(run).get(config, BASELINE) != BASELINE:
        return text
    cost, size = pass_cost(run, config, bucket)
    return text if math.isnan(size) else f"{text}; pass {_f2(cost)} steps, {_f2(size)} tok/pass"


def _pass_size_section(run, cats, labels) -> list[str]:
    engine = [c["label"] for c in run["matrix"]["configs"]
              if c.get("kind", "engine") == "engine" and c["label"] != BASELINE]
    engine = [c for c in engine if pass_size_hist(run, c)]
    if not engine:
        return []
    lines = ["## Verify pass sizes", "",
             "Tokens per target pass (the pending token plus the drafts; a plain step is 1): the "
             "share of passes of each size, per category.", ""]
    for c in engine:
        lines += [f"### {c}", ""]
        rows = []
        for cat in [*cats, OVERALL]:
            h = pass_size_hist(run, c, None if cat == OVERALL else cat)
            n = sum(h.values())
            if not n:
                continue
            dist = " ".join(f"{k}:{v / n:.0%}" for k, v in h.items())
            rows.append((cat, str(n), _f2(histogram_mean(h)), dist))
        lines += _table(("category", "passes", "mean size", "size:share"), rows) + [""]
    return lines


def _tree_section(run, cats, labels) -> list[str]:
    rows = []
    for c in labels:
        for cat in [*cats, OVERALL]:
            recs = [r for r in ok_records(run) if r.get("config") == c
                    and (cat == OVERALL or r.get("category") == cat)]
            t = tree_summary(recs)
            if t is not None:
                rows.append((c, cat, str(t["passes"]), _f2(t["nodes"]), _f2(t["branches"]),
                             _f2(t["path"]), _pct(t["off_first"]),
                             f"{t['kept_per_pass']:.2f} / {t['drafted_per_pass']:.2f}"))
    if not rows:
        return []
    return ["## Draft trees", "",
            "Passes that verified a tree (`--tree-width`): nodes and branches per pass, the "
            "accepted path's length, how often it left the first branch (what a linear draft "
            "would not have kept), and verify occupancy: positions kept / drafted per pass.", "",
            *_table(("config", "category", "tree passes", "nodes", "branches", "accepted path",
                     "off first branch", "occupancy"), rows), ""]


def _divergence_section(run) -> list[str]:
    div = divergences(run)
    if not div:
        return []
    lines = ["## Divergences from the plain path", "",
             "Greedy runs whose tokens differ from the plain path's. At the first differing "
             "token, gap = the plain run's logit of its own token minus that of the speculative "
             "run's token: a **near-tie** (gap within the measured batch noise, so the default "
             "mode's lossless guarantee holds) or a **defect** (larger, or any divergence in exact "
             "mode).", ""]
    rows = []
    for r in div:
        d = r.get("divergence") or {"kind": "unattributed"}
        gap = d.get("gap")
        rows.append((r["config"], r["prompt_id"], str(r["turn"]), str(d.get("position", "–")),
                     "–" if gap is None else f"{'≥' if d.get('gap_is_bound') else ''}{gap:.3f}",
                     d["kind"] + (f" ({d['reason']})" if d.get("reason") else "")))
    lines += _table(("config", "prompt", "turn", "first differing token", "gap (logits)", "verdict"),
                    rows)
    return lines + [""]


def _acceptance_section(run, cats, labels) -> list[str]:
    drafted = [c for c in labels if c != BASELINE]
    if not drafted:
        return []
    lines = ["## Acceptance", "",
             "acceptance = accepted / drafted tokens; accepted length = tokens emitted per target "
             "pass (the target's own token included, so a plain step is 1); parity = requests whose "
             "output tokens equal the plain path's.", ""]
    rows = []
    for c in drafted:
        s = config_summary(run, c)
        pos = " ".join(_pct(x) for x in s.position_acceptance[:8]) or "–"
        rows.append((c, _pct(s.acceptance_rate), _f2(s.mean_accepted_length), _pct(s.proposer_share),
                     pos, f"{s.parity[0]}/{s.parity[1]}" if s.parity[1] else "–", str(s.errors)))
    lines += _table(("config", "acceptance", "accepted length", "proposer share",
                     "acceptance by position 1..8", "parity", "errors"), rows)
    lines += ["", "### Per category (acceptance / accepted length)", ""]
    lines += _table(("category", *drafted),
                    ((cat, *(f"{_pct(s.acceptance_rate)} / {_f2(s.mean_accepted_length)}"
                             for s in (config_summary(run, c, cat) for c in drafted)))
                     for cat in cats))
    lines.append("")
    return lines


def _latency_section(run, labels) -> list[str]:
    lines = ["## Latency", "", "Milliseconds unless marked; ITL = inter-token latency, pooled over "
             "every token of every request (tokens of one verify pass arrive together).", ""]
    rows = []
    for c in labels:
        s = config_summary(run, c)
        rows.append((c, str(s.requests), _ms(s.prefill_p50), _ms(s.ttft_p50), _ms(s.ttft_p95),
                     _ms(s.itl_p50), _ms(s.itl_p95), _ms(s.itl_p99), f"{s.e2e_p50:.2f} s",
                     f"{s.e2e_p95:.2f} s", f"{s.decode_tps_p50:.1f}", f"{s.rss_peak / 2**20:.0f} MiB",
                     f"+{s.rss_growth / 2**20:.1f} MiB"))
    lines += _table(("config", "requests", "prefill p50", "TTFT p50", "TTFT p95", "ITL p50",
                     "ITL p95", "ITL p99", "e2e p50", "e2e p95", "decode tok/s p50",
                     "process RSS", "RSS growth"), rows)
    lines += ["", "Process RSS: the most the (shared) process held during this configuration's "
              "requests; RSS growth: the most one of its requests added to it. What loading "
              "each model added is under Run. ITL percentiles of this edgespec are pooled from "
              "per-request histograms, exact to about 10 %.", ""]
    lines.append("")
    return lines


def write_report(run: Mapping, out_dir: str | os.PathLike,
                 say: Callable[[str], None] | None = None) -> Path:
    """report.md + PNGs in out_dir; returns the Markdown path. ``say`` hears each step (a
    plot, the tables), so writing a big report is never a silent minute."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = say or (lambda line: None)
    plots = render_plots(run, out, say=say) if run["records"] else {}
    say("report: tables (bootstrap intervals)")
    path = out / "report.md"
    path.write_text(render_markdown(run, plots), encoding="utf-8")
    return path

