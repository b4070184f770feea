"""The replay's report: predicted vs measured speedups, per configuration and prompt."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from .cost import Overheads
from ...api.stats import geometric_mean
from .replay import MAIN, PLAIN_LABEL, VARIANTS, Comparison, Traces
from .record import controller_code
from dataclasses import asdict


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%" if x == x else "-"


def _ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def anchor_rows(run_dir: Path) -> dict[str, dict[int, float]]:
    """From the run's bench.json: each anchor's measured decode speedup over its own plain
    path per unit (llama-lookup over llama-completion), which no trace can replay."""
    path = run_dir / "bench.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    base_of = {c["label"]: c.get("baseline") for c in data.get("matrix", {}).get("configs", [])
               if c.get("kind") == "anchor"}
    rate: dict[tuple[str, int], float] = {}
    for r in data.get("records", []):
        if "error" not in r and r.get("decode_tokens_per_second"):
            rate[(r["config"], r["unit"])] = r["decode_tokens_per_second"]
    out: dict[str, dict[int, float]] = {}
    for label, base in base_of.items():
        if base is None or base == label:
            continue
        for (cfg, unit), v in rate.items():
            b = rate.get((base, unit))
            if cfg == label and b:
                out.setdefault(f"{label} / {base}", {})[unit] = v / b
    return out


def format_report(comp: Comparison, over: Mapping[str, Overheads], traces: Traces,
                  run_dir: Path | None = None) -> str:
    lines = _intro(comp, traces)
    lines += _per_prompt(comp, run_dir)
    lines += _by_variant(comp)
    lines += _overheads(over)
    return "\n".join(lines) + "\n"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(cells: Sequence[str]) -> list[str]:
    return [_row(cells), "|" + "---|" * len(cells)]


def _intro(comp: Comparison, traces: Traces) -> list[str]:
    """What was replayed, how much of it reproduced, and each engine's depth curve."""
    lines: list[str] = []
    n_units = len({r.get("unit") for r in traces.measured})
    lines.append(f"Replay of {len(traces.measured)} recorded requests ({n_units} prompts, "
                 f"{len({r['config'] for r in traces.measured})} configurations) through the "
                 "controllers the engine built, on the run's own cost curves.")
    lines.append(f"Pass structure reproduced (same drafts, decisions, accepted counts and "
                 f"number of passes) for {comp.reproduced} of {comp.replayed} requests.")
    if traces.header.get("controller_code") not in (None, controller_code()):
        lines.append("  Note: the controller's code (edgespec/control) differs from the run's, so "
                     "its decisions need not match the recording; replay with the run's version.")
    for cfg, prompt, at in comp.diverged[:10]:
        lines.append(f"  - {cfg} on {prompt}: left the recording at pass {at}")
    lines.append("")
    lines.append("Speedup = decode rate (tokens after the first / seconds after the first "
                 f"token, as the bench computes it) over the plain path ({PLAIN_LABEL}) on the "
                 "same prompt of the same run; predicted = both rates replayed on the cost "
                 "model, measured = both as timed; error = predicted / measured - 1.")
    for key, e in traces.header["engines"].items():
        curve = traces.curve(key)
        steps = ", ".join(f"{d}: {_ms(curve.seconds(1, d))} / {_ms(curve.seconds(4, d))}"
                          for d in curve.depths)
        busy = f"; others used {curve.busy:.0%} of the CPUs while it was measured" if curve.busy > 0.25 else ""
        lines.append(f"- {key} engine's depth curve, ms for a 1-token / 4-token pass at "
                     f"cached cells {steps}{busy}")
    return lines


def _per_prompt(comp: Comparison, run_dir: Path | None) -> list[str]:
    """One table per configuration: each prompt's measured and predicted speedup."""
    lines = ["", f"## Per prompt ({MAIN.lstrip('+ ')} model: depth curve + fitted overheads)"]
    anchors = anchor_rows(run_dir) if run_dir is not None else {}
    for cfg, units in comp.rows.items():
        lines.append("")
        lines.append(f"### {cfg}")
        lines += _head(["prompt", "measured", "predicted", "error", "passes", "reproduced"]
                       + list(anchors))
        for unit, row in sorted(units.items(), key=lambda x: (x[0] is None, x[0])):
            cells = [str(row["prompt"]), f"{row['measured']:.3f}", f"{row['predicted']:.3f}",
                     _pct(row["error"]), f"{row['passes']}/{row['replayed_passes']}",
                     "yes" if row["reproduced"] else "no"]
            cells += [f"{a[unit]:.3f}" if unit in a else "-" for a in anchors.values()]
            lines.append(_row(cells))
        ms = geometric_mean(r["measured"] for r in units.values())
        ps = geometric_mean(r["predicted"] for r in units.values())
        errs = [abs(r["error"]) for r in units.values()]
        cells = ["**geomean**", f"{ms:.3f}", f"{ps:.3f}", _pct(ps / ms - 1.0),
                 f"mean abs error {sum(errs) / len(errs) * 100:.1f}%" if errs else "-", ""]
        cells += [f"{geometric_mean(a.values()):.3f}" for a in anchors.values()]
        lines.append(_row(cells))
    return lines


def _by_variant(comp: Comparison) -> list[str]:
    """The geomean error per configuration under each cost model variant."""
    lines = ["", "## Geomean speedup error per configuration, by what the cost model includes",
             "",
             "flat curve: the controller's calibration (64 cached cells) and nothing else, "
             "what `edgespec.lab.replay.generations` charges; + depth: the curve measured at several "
             "depths, interpolated; + overheads: the loop's per-pass costs fitted from the "
             "recorded gaps (the model above); + pass scale: the run-wide measured/curve "
             "pass-time ratio, plain and verify passes apart (fitted on this run).", ""]
    lines += _head(["configuration", "measured geomean"] + [f"{v}" for v in VARIANTS])
    for cfg in comp.rows:
        m = comp.variants[MAIN].get(cfg, (float("nan"),))[0]
        cells = [cfg, f"{m:.3f}"]
        for v in VARIANTS:
            mm, pp = comp.variants.get(v, {}).get(cfg, (float("nan"), float("nan")))
            cells.append(f"{pp:.3f} ({_pct(pp / mm - 1.0)})")
        lines.append(_row(cells))
    return lines


def _overheads(over: Mapping[str, Overheads]) -> list[str]:
    """The loop's fitted per-pass costs per configuration."""
    lines = ["", "## Fitted overheads per configuration (ms; medians over its recorded passes)",
             ""]
    lines += _head(["configuration", "passes", "plain pass", "verify pass", "per drafted row",
                    "free proposers", "costly/token", "tail"])
    for cfg, o in over.items():
        lines.append(_row([cfg, str(o.passes), _ms(o.plain), _ms(o.verify), _ms(o.per_row),
                           _ms(o.propose), _ms(o.costly_token), _ms(o.tail)]))
    return lines


def comparison_json(comp: Comparison, over: Mapping[str, Overheads]) -> dict:
    return {"rows": {c: {str(u): r for u, r in units.items()} for c, units in comp.rows.items()},
            "variants": {v: {c: {"measured": m, "predicted": p} for c, (m, p) in cfgs.items()}
                         for v, cfgs in comp.variants.items()},
            "reproduced": comp.reproduced, "replayed": comp.replayed,
            "diverged": [list(d) for d in comp.diverged],
            "overheads": {c: asdict(o) for c, o in over.items()}}
