"""The report's PNG plots (matplotlib, Agg): speedup per category, the accepted-length
distribution, per-request acceptance, latency percentiles."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from .matrix import BASELINE
from .results import OVERALL, categories, config_labels, config_summary, speedup_table


def render_plots(run: Mapping, out_dir: Path) -> dict[str, str]:
    """Write the PNGs; returns {title: file name}."""
    # deferred: matplotlib is the [bench] extra, and slow to import
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = config_labels(run)
    others = [c for c in labels if c != BASELINE]
    made: dict[str, str] = {}
    if others:
        made["Speedup per category"] = _speedup(plt, run, others, out_dir)
        made["Accepted-length distribution"] = _accepted_length(plt, run, others, out_dir)
        made["Per-request acceptance"] = _request_acceptance(plt, run, others, out_dir)
    made["Latency percentiles"] = _latency(plt, run, labels, out_dir)
    return made


def _speedup(plt, run: Mapping, others: Sequence[str], out_dir: Path) -> str:
    cats = categories(run)
    table = speedup_table(run, "category", cats)
    groups = [g for g in [*cats, OVERALL] if g in table]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(groups) * max(1, len(others)) + 1.5))
    height = 0.8 / len(others)
    for j, c in enumerate(others):
        ys, xs, lo, hi = [], [], [], []
        for i, g in enumerate(groups):
            iv = table[g][c].decode
            if iv.n == 0:
                continue
            ys.append(i + j * height)
            xs.append(iv.estimate)
            lo.append(iv.estimate - iv.low)
            hi.append(iv.high - iv.estimate)
        ax.barh(ys, xs, height=height, xerr=[lo, hi], label=c, capsize=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(groups))], groups)
    ax.invert_yaxis()
    ax.set_xlabel("decode speedup over plain (geometric mean, CI)")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "speedup.png")


def _accepted_length(plt, run: Mapping, others: Sequence[str], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    kmax = 1
    for c in others:
        hist = config_summary(run, c).accepted_length_hist
        if hist:
            kmax = max(kmax, max(hist))
    width = 0.8 / len(others)
    for j, c in enumerate(others):
        hist = config_summary(run, c).accepted_length_hist
        n = sum(hist.values()) or 1
        ks = list(range(1, kmax + 1))
        ax.bar([k + j * width for k in ks], [hist.get(k, 0) / n for k in ks], width=width, label=c)
    ax.set_xlabel("tokens emitted per target pass (accepted + 1)")
    ax.set_ylabel("fraction of passes")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "accepted_length.png")


def _request_acceptance(plt, run: Mapping, others: Sequence[str], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    drew = False
    for c in others:
        acc = config_summary(run, c).request_acceptance
        if acc:
            ax.hist(acc, bins=[i / 10 for i in range(11)], alpha=0.5, label=c)
            drew = True
    ax.set_xlabel("acceptance rate of one request (requests that drafted)")
    ax.set_ylabel("requests")
    if drew:
        ax.legend(fontsize=8)
    return _save(fig, out_dir, "request_acceptance.png")


def _latency(plt, run: Mapping, labels: Sequence[str], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(labels))
    names = ["TTFT p50", "ITL p50", "ITL p95", "ITL p99"]
    for j, c in enumerate(labels):
        s = config_summary(run, c)
        vals = [s.ttft_p50, s.itl_p50, s.itl_p95, s.itl_p99]
        ax.bar([i + j * width for i in range(len(names))],
               [0 if math.isnan(v) else v * 1000 for v in vals], width=width, label=c)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "latency.png")


def _save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    # deferred: matplotlib is the [bench] extra, and slow to import
    import matplotlib.pyplot as plt
    plt.close(fig)
    return name
