"""The report's PNG plots (matplotlib, Agg): speedup per category, the accepted-length
distribution, per-request acceptance, latency percentiles.

Every plot stands alone when it is shared: its title says what is measured, the model, the
machine and the date, and a caption line says what the bars and whiskers are. Bars of
several configurations stand side by side (never overlapping), centred on their tick.
The acceptance plots leave out configurations that never drafted (the plain path, plain
anchors such as llama-completion), which have no acceptance to show. Latency is two panels,
time to first token and inter-token latency, each on its own scale (TTFT is often 100x ITL).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .matrix import BASELINE
from .results import (OVERALL, busy_warning, categories, config_labels, config_summary,
                      speedup_table)


def render_plots(run: Mapping, out_dir: Path, say: Callable[[str], None] | None = None
                 ) -> dict[str, str]:
    """Write the PNGs; returns {title: file name}. ``say`` hears each plot as it is drawn."""
    # deferred: matplotlib is the [bench] extra, and slow to import
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    say = say or (lambda line: None)
    labels = config_labels(run)
    others = [c for c in labels if c != BASELINE]
    drafting = [c for c in others if not math.isnan(config_summary(run, c).acceptance_rate)]
    todo: list[tuple[str, str, Callable[[], str]]] = []
    if others:
        todo.append(("Speedup per category", "speedup.png",
                     lambda: _speedup(plt, run, others, out_dir)))
    if drafting:
        todo.append(("Accepted-length distribution", "accepted_length.png",
                     lambda: _accepted_length(plt, run, drafting, out_dir)))
        todo.append(("Per-request acceptance", "request_acceptance.png",
                     lambda: _request_acceptance(plt, run, drafting, out_dir)))
    todo.append(("Latency percentiles", "latency.png", lambda: _latency(plt, run, labels, out_dir)))
    made: dict[str, str] = {}
    for i, (title, name, draw) in enumerate(todo, 1):
        say(f"report: plot {i}/{len(todo)} {name}")
        made[title] = draw()
    return made


def subtitle(run: Mapping) -> str:
    """Model · machine · date, the line under every plot's title."""
    ident = run.get("identity", {})
    models = ident.get("models", {})
    target = str((models.get("target") or next(iter(models.values()), {})).get("name")
                 or run.get("matrix", {}).get("target", "?"))
    target = Path(target).name if target.endswith(".gguf") else target  # a path: its file
    mach = ident.get("machine", {})
    eng = ident.get("engine", {})
    cpu = mach.get("cpu_model") or "?"
    threads = eng.get("threads") or run.get("matrix", {}).get("threads")
    threads_text = f", {threads} thread{'s' if threads != 1 else ''}" if threads else ""
    date = str(ident.get("date") or "?")[:16].replace("T", " ")
    busy = " · BUSY machine: timings are noise" if busy_warning(run) else ""
    return f"{target} · {cpu}{threads_text} · {date}{busy}"


def _titles(ax, run: Mapping, what: str, bars: str) -> None:
    ax.set_title(f"{what}\n{subtitle(run)}", fontsize=10)
    ax.figure.text(0.01, 0.005, bars, fontsize=7.5, color="#444444", ha="left", va="bottom")


def _grouped(n_groups: int, n_series: int, width: float = 0.8) -> tuple[float, Callable[[int, int], float]]:
    """(bar width, position(group, series)): series side by side, centred on group's tick."""
    w = width / max(1, n_series)
    return w, lambda g, j: g - width / 2 + w * (j + 0.5)


def _speedup(plt, run: Mapping, others: Sequence[str], out_dir: Path) -> str:
    cats = categories(run)
    table = speedup_table(run, "category", cats)
    groups = [g for g in [*cats, OVERALL] if g in table]
    fig, ax = plt.subplots(figsize=(8.5, 0.45 * len(groups) * max(1, len(others)) + 2.3))
    height, at = _grouped(len(groups), len(others))
    for j, c in enumerate(others):
        ys, xs, lo, hi = [], [], [], []
        for i, g in enumerate(groups):
            iv = table[g][c].decode
            if iv.n == 0:
                continue
            ys.append(at(i, j))
            xs.append(iv.estimate)
            lo.append(max(iv.estimate - iv.low, 0.0))
            hi.append(max(iv.high - iv.estimate, 0.0))
        ax.barh(ys, xs, height=height, xerr=[lo, hi], label=c, capsize=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(groups)), groups)
    ax.invert_yaxis()
    ax.set_xlabel("decode speedup over plain (×; 1 = as fast as plain)")
    ax.legend(fontsize=8)
    _titles(ax, run, "Decode speedup over plain decoding, per category",
            "bars: median of paired per-prompt ratios (category), geometric mean (all); "
            "whiskers: bootstrap confidence interval")
    return _save(fig, out_dir, "speedup.png")


def _accepted_length(plt, run: Mapping, drafting: Sequence[str], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.6))
    hists = {c: config_summary(run, c).accepted_length_hist for c in drafting}
    kmax = max((max(h) for h in hists.values() if h), default=1)
    ks = list(range(1, kmax + 1))
    width, at = _grouped(len(ks), len(drafting))
    for j, c in enumerate(drafting):
        hist = hists[c]
        n = sum(hist.values()) or 1
        ax.bar([at(k, j) for k in ks], [hist.get(k, 0) / n for k in ks], width=width, label=c)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("tokens emitted per target pass (accepted drafts + 1)")
    ax.set_ylabel("fraction of passes")
    ax.legend(fontsize=8)
    _titles(ax, run, "Tokens per target pass (configurations that drafted)",
            "bars: share of each configuration's target passes that emitted k tokens; "
            "1 = a pass that kept no draft")
    return _save(fig, out_dir, "accepted_length.png")


def _request_acceptance(plt, run: Mapping, drafting: Sequence[str], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.6))
    edges = [i / 10 for i in range(11)]
    width, at = _grouped(10, len(drafting))
    for j, c in enumerate(drafting):
        counts = [0] * 10
        for a in config_summary(run, c).request_acceptance:
            counts[min(int(a * 10), 9)] += 1  # 1.0 falls in the last bin, as in numpy
        ax.bar([at(i, j) for i in range(10)], counts, width=width, label=c)
    ax.set_xticks(range(10), [f"{lo:.0%}–{hi:.0%}" for lo, hi in zip(edges, edges[1:])],
                  fontsize=7.5)
    ax.set_xlabel("acceptance rate of one request (drafted tokens the target kept)")
    ax.set_ylabel("requests")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    _titles(ax, run, "Per-request acceptance (requests that drafted)",
            "bars: number of requests whose acceptance falls in each 10 % range")
    return _save(fig, out_dir, "request_acceptance.png")


def _latency(plt, run: Mapping, labels: Sequence[str], out_dir: Path) -> str:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.6),
                                      gridspec_kw={"width_ratios": [2, 3]})
    panels = ((left, ["TTFT p50", "TTFT p95"], lambda s: [s.ttft_p50, s.ttft_p95]),
              (right, ["ITL p50", "ITL p95", "ITL p99"], lambda s: [s.itl_p50, s.itl_p95, s.itl_p99]))
    for ax, names, values in panels:
        width, at = _grouped(len(names), len(labels))
        for j, c in enumerate(labels):
            vals = values(config_summary(run, c))
            ax.bar([at(i, j) for i in range(len(names))],
                   [0 if math.isnan(v) else v * 1000 for v in vals], width=width, label=c)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("milliseconds")
    left.set_title("time to first token", fontsize=9)
    right.set_title("inter-token latency", fontsize=9)
    right.legend(fontsize=8)
    fig.suptitle(f"Latency percentiles per configuration\n{subtitle(run)}", fontsize=10)
    fig.text(0.01, 0.005, "bars: percentiles over every request (TTFT) or every token (ITL; "
             "tokens of one verify pass arrive together, so p50 may be 0); each panel its own scale",
             fontsize=7.5, color="#444444", ha="left", va="bottom")
    return _save(fig, out_dir, "latency.png")


def _save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out_dir / name, dpi=110)
    # deferred: matplotlib is the [bench] extra, and slow to import
    import matplotlib.pyplot as plt
    plt.close(fig)
    return name
