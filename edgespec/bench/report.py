"""The run as JSON (every per-request record + identity) and as a Markdown report with PNG plots.

Everything here reads the JSON-shaped dict, so a report can be rebuilt from a saved
run (``edgespec bench --report-from run.json``) and tests can feed literal records.

Speedup = the paired ratio config / plain of decode tokens per second per unit (prompt,
turn), summarised per category by the median and over all prompts by the geometric mean,
each with a bootstrap interval that resamples prompts. An anchor is paired with its own
plain path (llama-lookup with llama-completion), so every ratio measures speculation.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .matrix import BASELINE
from .prompts import bucket_labels
from .stats import Interval, geometric_mean, histogram_mean, histogram_sum, median, percentile, speedup
from ..errors import InvalidInputError

OVERALL = "all"
#: what a user would otherwise run: every configuration is also reported against it
PLAIN_LLAMA = "llama-completion"


# --- JSON ---------------------------------------------------------------------------
def write_json(run: Mapping, path: str | os.PathLike) -> Path:
    """Write atomically, so an interrupted write never leaves half a file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(run, indent=1, default=_jsonable), encoding="utf-8")
    tmp.replace(path)
    return path


def _jsonable(x):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def load_run(path: str | os.PathLike) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"benchmark file {path} not found") from None
    except ValueError as e:
        raise InvalidInputError(f"{path}: not a benchmark JSON file ({e})") from None
    if not isinstance(data, dict) or "records" not in data or "matrix" not in data:
        raise InvalidInputError(f"{path}: not a benchmark JSON file (no records/matrix)")
    return data


# --- summaries ----------------------------------------------------------------------
def ok_records(run: Mapping) -> list[dict]:
    return [r for r in run["records"] if "error" not in r]


def config_labels(run: Mapping) -> list[str]:
    return [c["label"] for c in run["matrix"]["configs"]]


def baselines(run: Mapping) -> dict[str, str]:
    """label -> the label it is paired with (older runs: always the plain path)."""
    return {c["label"]: c.get("baseline", BASELINE) for c in run["matrix"]["configs"]}


def categories(run: Mapping) -> list[str]:
    seen: dict[str, None] = {}
    for r in run["records"]:
        seen.setdefault(r["category"], None)
    return list(seen)


@dataclass(frozen=True)
class SpeedupCell:
    decode: Interval
    e2e: Interval
    missing: int  # units measured on one side only (error, or <2 tokens)


def _unit(r: Mapping) -> tuple[str, int]:
    return (r["prompt_id"], int(r["turn"]))


def speedup_cell(records: Sequence[Mapping], config: str, *, resamples: int = 2000,
                 confidence: float = 0.95, seed: int = 0, baseline: str = BASELINE,
                 statistic=geometric_mean) -> SpeedupCell:
    """Paired speedups of one configuration over its baseline on the given records."""
    base = [r for r in records if r["config"] == baseline]
    cand = [r for r in records if r["config"] == config]
    kw = dict(cluster_of=lambda u: u[0], n_resamples=resamples, confidence=confidence, seed=seed,
              statistic=statistic)
    dec, pr = speedup({_unit(r): r["decode_tokens_per_second"] for r in base},
                      {_unit(r): r["decode_tokens_per_second"] for r in cand}, **kw)
    e2e, _ = speedup({_unit(r): r["e2e_seconds"] for r in base},
                     {_unit(r): r["e2e_seconds"] for r in cand}, higher_is_better=False, **kw)
    return SpeedupCell(dec, e2e, len(pr.missing))


def speedup_table(run: Mapping, group_key: str = "category", groups: Sequence[str] | None = None
                  ) -> dict[str, dict[str, SpeedupCell]]:
    """{group: {config: cell}} plus the OVERALL group, for every non-baseline configuration,
    each paired with its own baseline: the median per group, the geometric mean overall."""
    m = run["matrix"]
    recs = ok_records(run)
    groups = list(groups) if groups is not None else _distinct(r[group_key] for r in recs)
    out: dict[str, dict[str, SpeedupCell]] = {}
    kw = dict(resamples=m.get("bootstrap_resamples", 2000), confidence=m.get("confidence", 0.95),
              seed=m.get("seed", 0))
    base_of = baselines(run)
    for g in [*groups, OVERALL]:
        sub = recs if g == OVERALL else _group(recs, group_key, g)
        if not sub:
            continue
        stat = geometric_mean if g == OVERALL else median
        out[g] = {c: speedup_cell(sub, c, baseline=base_of.get(c, BASELINE), statistic=stat, **kw)
                  for c in config_labels(run) if c != BASELINE}
    return out


def vs_llama_table(run: Mapping, groups: Sequence[str] | None = None
                   ) -> dict[str, dict[str, SpeedupCell]]:
    """{group: {config: cell}}: every configuration (our plain path included) against
    ``llama-completion`` on the same units, when the run has it; {} otherwise."""
    if PLAIN_LLAMA not in config_labels(run):
        return {}
    m = run["matrix"]
    recs = ok_records(run)
    groups = list(groups) if groups is not None else _distinct(r["category"] for r in recs)
    kw = dict(resamples=m.get("bootstrap_resamples", 2000), confidence=m.get("confidence", 0.95),
              seed=m.get("seed", 0))
    out: dict[str, dict[str, SpeedupCell]] = {}
    for g in [*groups, OVERALL]:
        sub = recs if g == OVERALL else _group(recs, "category", g)
        if sub:
            stat = geometric_mean if g == OVERALL else median
            out[g] = {c: speedup_cell(sub, c, baseline=PLAIN_LLAMA, statistic=stat, **kw)
                      for c in config_labels(run) if c != PLAIN_LLAMA}
    return out


def category_mean(table: Mapping[str, Mapping[str, SpeedupCell]], config: str,
                  cats: Sequence[str]) -> float:
    """Arithmetic mean of the per-category medians (every category weighs the same)."""
    vals = [table[c][config].decode.estimate for c in cats
            if c in table and config in table[c] and table[c][config].decode.n]
    return sum(vals) / len(vals) if vals else math.nan


def _group(recs: Sequence[Mapping], key: str, value: str) -> list[Mapping]:
    if key == "bucket":
        # Buckets come from the plain request's prompt length, so both sides of a pair agree.
        units = {_unit(r) for r in recs if r["config"] == BASELINE and r.get("bucket") == value}
        return [r for r in recs if _unit(r) in units]
    return [r for r in recs if r.get(key) == value]


def _distinct(values: Iterable) -> list:
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class ConfigSummary:
    requests: int
    errors: int
    acceptance_rate: float  # pooled accepted / drafted
    mean_accepted_length: float  # pooled tokens per target pass
    accepted_length_hist: dict[int, int]
    position_acceptance: list[float]
    request_acceptance: list[float]  # per request, for requests that drafted anything
    parity: tuple[int, int]  # (same as plain, compared)
    proposer_share: float  # mean share of emitted tokens that came from the proposer
    prefill_p50: float
    ttft_p50: float
    ttft_p95: float
    itl_p50: float
    itl_p95: float
    itl_p99: float
    e2e_p50: float
    e2e_p95: float
    decode_tps_p50: float
    rss_peak: int


def config_summary(run: Mapping, config: str, category: str | None = None) -> ConfigSummary:
    allr = [r for r in run["records"] if r["config"] == config
            and (category is None or r["category"] == category)]
    recs = [r for r in allr if "error" not in r]
    drafted = sum(r["drafted"] for r in recs)
    accepted = sum(r["accepted"] for r in recs)
    hist = histogram_sum([r["accepted_length_hist"] for r in recs])
    pos_d: list[int] = []
    pos_a: list[int] = []
    for r in recs:
        for i, (d, a) in enumerate(zip(r.get("position_drafted", []), r.get("position_accepted", []))):
            while len(pos_d) <= i:
                pos_d.append(0)
                pos_a.append(0)
            pos_d[i] += d
            pos_a[i] += a
    itl = [b - a for r in recs for a, b in zip(r["token_times"], r["token_times"][1:])]
    compared = [r["parity"] for r in recs if r.get("parity") is not None]
    shares = [1.0 - r["proposer_share"].get("target", 1.0) for r in recs if r["proposer_share"]]
    ttft = [r["ttft_seconds"] for r in recs if r["ttft_seconds"] is not None]
    mean_len = histogram_mean(hist)
    if not hist:  # llama.cpp's tools report totals: tokens computed per pass
        passes = [(r.get("generated_tokens", 0), r.get("verify_passes")) for r in recs]
        n_pass = sum(p for _, p in passes if p)
        mean_len = sum(g - 1 for g, p in passes if p) / n_pass if n_pass else math.nan
    return ConfigSummary(
        requests=len(recs), errors=len(allr) - len(recs),
        acceptance_rate=accepted / drafted if drafted else math.nan,
        mean_accepted_length=mean_len, accepted_length_hist=hist,
        position_acceptance=[a / d if d else math.nan for a, d in zip(pos_a, pos_d)],
        request_acceptance=[r["acceptance_rate"] for r in recs if r["drafted"]],
        parity=(sum(compared), len(compared)),
        proposer_share=sum(shares) / len(shares) if shares else math.nan,
        prefill_p50=percentile([r["prefill_seconds"] for r in recs], 50),
        ttft_p50=percentile(ttft, 50), ttft_p95=percentile(ttft, 95),
        itl_p50=percentile(itl, 50), itl_p95=percentile(itl, 95), itl_p99=percentile(itl, 99),
        e2e_p50=percentile([r["e2e_seconds"] for r in recs], 50),
        e2e_p95=percentile([r["e2e_seconds"] for r in recs], 95),
        decode_tps_p50=percentile([r["decode_tokens_per_second"] for r in recs], 50),
        rss_peak=max((r.get("rss_peak_bytes", 0) for r in recs), default=0),
    )


# --- qualification --------------------------------------------------------------------
def slice_results(run: Mapping, config: str) -> dict[str, dict]:
    """Per category: what `edgespec qualify` stores for a target–proposer pair."""
    table = speedup_table(run)
    out = {}
    for cat, cells in table.items():
        if cat == OVERALL or config not in cells:
            continue
        s = config_summary(run, config, cat)
        cell = cells[config]
        out[cat] = {
            "acceptance_rate": _num(s.acceptance_rate),
            "mean_accepted_length": _num(s.mean_accepted_length),
            "speedup": _num(cell.decode.estimate),
            "speedup_ci_low": _num(cell.decode.low),
            "speedup_ci_high": _num(cell.decode.high),
            "e2e_speedup": _num(cell.e2e.estimate),
            "n": cell.decode.n,
            "parity": f"{s.parity[0]}/{s.parity[1]}",
        }
    return out


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


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


def render_markdown(run: Mapping, plots: Mapping[str, str] | None = None) -> str:
    m = run["matrix"]
    ident = run.get("identity", {})
    labels = config_labels(run)
    others = [c for c in labels if c != BASELINE]
    cats = categories(run)
    units = {_unit(r) for r in run["records"]}
    lines = [f"# edgespec benchmark ({m.get('preset', 'custom')})", ""]
    if run.get("interrupted"):
        lines += ["**Interrupted**: the run was stopped early; these are the requests measured "
                  "before that.", ""]
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
        ("workload", f"{len(cats)} categories, {len({u[0] for u in units})} prompts, {len(units)} "
                     f"turns; {m['max_new_tokens']} new tokens; temperature {m['temperature']}"),
        ("configurations", ", ".join(labels)),
        ("engine", f"n_ctx {eng.get('n_ctx', m.get('n_ctx'))}, draft length {eng.get('draft_len', '?')}"),
        ("cold load", ", ".join(f"{k} {v:.2f} s" for k, v in run.get("load_seconds", {}).items())),
        ("warm-up", f"{run.get('warmup_discarded', 0)} requests discarded"),
    ]
    lines += _table(("", ""), facts) + [""]
    lines += [f"Per-request records and the full identity (llama.cpp system info included) are in "
              "the JSON file next to this report.", ""]

    lines += _vs_llama_section(run, cats)
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


def pass_cost(run: Mapping, config: str, bucket: str | None = None) -> tuple[float, float]:
    """(seconds of a multi-token verify pass in plain steps of the same units, mean tokens per
    pass) for an engine configuration; NaN where it never drafted or the plain path is missing."""
    recs = [r for r in ok_records(run) if bucket is None or r.get("bucket") == bucket]
    plain = {_unit(r): r for r in recs if r["config"] == BASELINE}
    step_s = pass_s = 0.0
    n_step = n_pass = tokens = passes = 0
    for r in recs:
        if r["config"] != config or "pass_size_hist" not in r or _unit(r) not in plain:
            continue
        p = plain[_unit(r)]
        n1, s1 = p.get("pass_size_hist", {}).get("1", 0), p.get("pass_seconds", {}).get("1", 0.0)
        for size, n in r["pass_size_hist"].items():
            tokens += int(size) * n
            passes += n
            if int(size) > 1:
                n_pass += n
                pass_s += r["pass_seconds"].get(size, 0.0)
        if n1:
            step_s += s1
            n_step += n1
    per_step = step_s / n_step if n_step else math.nan
    cost = (pass_s / n_pass) / per_step if n_pass and n_step and per_step > 0 else math.nan
    return cost, tokens / passes if passes else math.nan


def _bucket_cell(run, cell: SpeedupCell, config: str, bucket: str) -> str:
    text = _fmt_x(cell.decode)
    if baselines(run).get(config, BASELINE) != BASELINE:
        return text
    cost, size = pass_cost(run, config, bucket)
    return text if math.isnan(size) else f"{text}; pass {_f2(cost)} steps, {_f2(size)} tok/pass"


def pass_size_hist(run: Mapping, config: str, category: str | None = None) -> dict[int, int]:
    return histogram_sum([r.get("pass_size_hist", {}) for r in ok_records(run)
                          if r["config"] == config and (category is None or r["category"] == category)])


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


def tree_summary(records: Sequence[Mapping]) -> dict | None:
    """Draft-tree figures over records (None when no tree pass ran): passes, nodes and
    branches per pass, accepted path length, the share of accepted paths off the first
    branch, and verify occupancy (drafted positions per pass vs those kept)."""
    rs = [r for r in records if r.get("tree_passes")]
    passes = sum(r["tree_passes"] for r in rs)
    if not passes:
        return None
    share = sum(r.get("branch_utilisation", 0.0) * r["tree_passes"] for r in rs) / passes
    drafted = sum(r.get("drafted", 0) for r in rs)
    kept = sum(r.get("accepted", 0) for r in rs)
    vp = sum(r.get("verify_passes", 0) or 0 for r in rs) or 1
    return {"passes": passes, "nodes": sum(r["tree_nodes"] for r in rs) / passes,
            "branches": sum(r["tree_branches"] for r in rs) / passes,
            "path": sum(r["tree_accepted"] for r in rs) / passes, "off_first": share,
            "drafted_per_pass": drafted / vp, "kept_per_pass": kept / vp}


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


def divergences(run: Mapping) -> list[dict]:
    return [r for r in ok_records(run) if r.get("parity") is False and r.get("kind") == "engine"]


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
                     f"{s.e2e_p95:.2f} s", f"{s.decode_tps_p50:.1f}", f"{s.rss_peak / 2**20:.0f} MiB"))
    lines += _table(("config", "requests", "prefill p50", "TTFT p50", "TTFT p95", "ITL p50",
                     "ITL p95", "ITL p99", "e2e p50", "e2e p95", "decode tok/s p50", "peak RSS"), rows)
    lines.append("")
    return lines


# --- plots ----------------------------------------------------------------------------
def render_plots(run: Mapping, out_dir: Path) -> dict[str, str]:
    """Write the PNGs; returns {title: file name}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = config_labels(run)
    others = [c for c in labels if c != BASELINE]
    cats = categories(run)
    made: dict[str, str] = {}

    if others:
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
        made["Speedup per category"] = _save(fig, out_dir, "speedup.png")

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
        made["Accepted-length distribution"] = _save(fig, out_dir, "accepted_length.png")

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
        made["Per-request acceptance"] = _save(fig, out_dir, "request_acceptance.png")

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
    made["Latency percentiles"] = _save(fig, out_dir, "latency.png")
    return made


def _save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return name


def write_report(run: Mapping, out_dir: str | os.PathLike) -> Path:
    """report.md + PNGs in out_dir; returns the Markdown path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = render_plots(run, out) if run["records"] else {}
    path = out / "report.md"
    path.write_text(render_markdown(run, plots), encoding="utf-8")
    return path

