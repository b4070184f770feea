"""A benchmark run's figures: the run as JSON (every per-request record + identity), and
what the report, the CLI and qualification compute from it.

Everything here reads the JSON-shaped dict, so a report can be rebuilt from a saved
run (``edgespec bench --report-from run.json``) and tests can feed literal records.

Speedup = the paired ratio config / plain of decode tokens per second per unit (prompt,
turn, round), summarised per category by the median and over all prompts by the geometric mean,
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
from .stats import (Interval, geometric_mean, histogram_mean, histogram_percentile, histogram_sum,
                    latency_histogram, median, percentile, speedup)
from ...errors import InvalidInputError

OVERALL = "all"
#: what a user would otherwise run: every configuration is also reported against it
PLAIN_LLAMA = "llama-completion"


# --- JSON ---------------------------------------------------------------------------
def write_json(run: Mapping, path: str | os.PathLike,
               records_from: str | os.PathLike | None = None) -> Path:
    """Write atomically, so an interrupted write never leaves half a file behind. With
    ``records_from`` (the run's records.jsonl: its full records, one per line) the records
    are copied from that file line by line instead of taken from ``run``, whose records a
    run keeps compacted (records.compact): bench.json holds every record whole while the
    writer holds one line at a time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if records_from is None or not Path(records_from).is_file():
        tmp.write_text(json.dumps(run, indent=1, default=_jsonable), encoding="utf-8")
    else:
        head = json.dumps({k: v for k, v in run.items() if k != "records"}, indent=1,
                          default=_jsonable)
        with open(tmp, "w", encoding="utf-8") as out, \
                open(records_from, encoding="utf-8") as lines:
            out.write(head[:-2] + ',\n "records": [')  # head ends with "\n}"
            sep = "\n  "
            for line in lines:
                if line.strip():
                    out.write(sep + line.rstrip("\n"))
                    sep = ",\n  "
            out.write("\n ]\n}\n")
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
def busy_warning(run: Mapping) -> str:
    """One sentence when other processes used the CPUs at the start or during units ("" when
    the run was quiet, or is of an edgespec that did not measure it)."""
    b = run.get("busy") or {}
    limit = b.get("limit", 0.25)
    said = []
    if (b.get("at_start") or 0) > limit:
        said.append(f"other processes used {b['at_start']:.0%} of the CPUs at the start")
    if b.get("busy_units"):
        said.append(f"{b['busy_units']} of {b['units']} units ran while others took more than "
                    f"{limit:.0%} of the CPUs (at most {b['max_unit']:.0%})")
    return ("; ".join(said) + ". Timings on a busy machine are noise; run again on a quiet "
            "one before trusting them.") if said else ""


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


def unit_key(r: Mapping) -> tuple[str, int, int]:
    """One measured unit: a (prompt, turn) in one round (``--repeats``). Bootstrap intervals
    resample prompts (the first element), so repeated rounds add samples, not prompts."""
    return (r["prompt_id"], int(r["turn"]), int(r.get("round", 0)))


def speedup_cell(records: Sequence[Mapping], config: str, *, resamples: int = 2000,
                 confidence: float = 0.95, seed: int = 0, baseline: str = BASELINE,
                 statistic=geometric_mean) -> SpeedupCell:
    """Paired speedups of one configuration over its baseline on the given records."""
    base = [r for r in records if r["config"] == baseline]
    cand = [r for r in records if r["config"] == config]
    kw = dict(cluster_of=lambda u: u[0], n_resamples=resamples, confidence=confidence, seed=seed,
              statistic=statistic)
    dec, pr = speedup({unit_key(r): r["decode_tokens_per_second"] for r in base},
                      {unit_key(r): r["decode_tokens_per_second"] for r in cand}, **kw)
    e2e, _ = speedup({unit_key(r): r["e2e_seconds"] for r in base},
                     {unit_key(r): r["e2e_seconds"] for r in cand}, higher_is_better=False, **kw)
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
        units = {unit_key(r) for r in recs if r["config"] == BASELINE and r.get("bucket") == value}
        return [r for r in recs if unit_key(r) in units]
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
    rss_growth: int = 0  # the most RSS grew during one of its requests (0: not measured)


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
    # each request's ITLs as a histogram: what a run keeps (records.compact), and from whole
    # records the same, so a report rebuilt from bench.json is the run's report
    hists = [r["itl_hist"] if "itl_hist" in r else latency_histogram(r.get("token_times", []))
             for r in recs]
    itl_p50, itl_p95, itl_p99 = (histogram_percentile(hists, q) for q in (50, 95, 99))
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
        itl_p50=itl_p50, itl_p95=itl_p95, itl_p99=itl_p99,
        e2e_p50=percentile([r["e2e_seconds"] for r in recs], 50),
        e2e_p95=percentile([r["e2e_seconds"] for r in recs], 95),
        decode_tps_p50=percentile([r["decode_tokens_per_second"] for r in recs], 50),
        rss_peak=max((r.get("rss_peak_bytes", 0) for r in recs), default=0),
        rss_growth=max((r.get("rss_growth_bytes", 0) for r in recs), default=0),
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


# --- per pass ------------------------------------------------------------------------
def pass_cost(run: Mapping, config: str, bucket: str | None = None) -> tuple[float, float]:
    """(seconds of a multi-token verify pass in plain steps of the same units, mean tokens per
    pass) for an engine configuration; NaN where it never drafted or the plain path is missing."""
    recs = [r for r in ok_records(run) if bucket is None or r.get("bucket") == bucket]
    plain = {unit_key(r): r for r in recs if r["config"] == BASELINE}
    step_s = pass_s = 0.0
    n_step = n_pass = tokens = passes = 0
    for r in recs:
        if r["config"] != config or "pass_size_hist" not in r or unit_key(r) not in plain:
            continue
        p = plain[unit_key(r)]
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


def pass_size_hist(run: Mapping, config: str, category: str | None = None) -> dict[int, int]:
    return histogram_sum([r.get("pass_size_hist", {}) for r in ok_records(run)
                          if r["config"] == config and (category is None or r["category"] == category)])


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


def divergences(run: Mapping) -> list[dict]:
    return [r for r in ok_records(run) if r.get("parity") is False and r.get("kind") == "engine"]
