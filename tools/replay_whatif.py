"""What would another controller have done on a recorded run? (`edgespec bench --record`)

Replays one configuration's recorded requests through adaptive controllers built with other
settings or another cost curve, on the run's own cost model (the depth curve, the fitted
per-pass overheads and the run-wide pass scale: the replay's most faithful model), and
prints each variant's predicted decode speedup over the run's plain path, per prompt and as
a geomean. The first variant is the recording's own controller: compare against it.

    python tools/replay_whatif.py docs/bench/standard-amd512-2026-12-03 --config auto \\
        --variant cal=prior --variant cal=curve --variant cal=curve,margin=0.15

``cal=`` picks the curve the controller prices drafts with: ``recorded`` (what the engine
used), ``prior`` (the CPU prior), ``curve`` (the run's own depth curve at its second depth),
``exact`` (the exact engine's measured calibration). Other keys are ControlSettings fields.
Predictions off the recording are approximate: after a controller leaves the recorded
passes, candidates are the latest recorded ones still matching the output (edgespec.lab.replay).
"""
from __future__ import annotations

import argparse
import ast
import sys

from edgespec.calibration.curve import Calibration
from edgespec.control import GoodputGuard, make_controller
from edgespec.api.stats import geometric_mean
from edgespec.lab.replay.replay import (PLAIN_LABEL, fit, load_traces, models, recorded_settings,
                                       replay_request)


def _variant(text: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a bench --record output folder")
    ap.add_argument("--config", default="auto", help="the recorded configuration to replay")
    ap.add_argument("--engine", default="default", help="its engine key in traces.jsonl")
    ap.add_argument("--variant", action="append", default=[],
                    help="cal=NAME and ControlSettings fields, e.g. cal=curve,margin=0.15")
    args = ap.parse_args(argv)
    tr = load_traces(args.run)
    over = fit(tr)
    model_for, ov = models(tr, over)["+ pass scale"]
    eng = tr.header["engines"][args.engine]
    depths = eng["depth_curve"]["depths"]
    curves = {"prior": None, "curve": Calibration.from_json(depths[min(1, len(depths) - 1)]["calibration"])}
    if "exact" in tr.header["engines"] and tr.header["engines"]["exact"].get("calibration"):
        curves["exact"] = Calibration.from_json(tr.header["engines"]["exact"]["calibration"])
    plain = {r["unit"]: replay_request(r, None, model_for[args.engine], ov.get(PLAIN_LABEL))
             for r in tr.measured if r["config"] == PLAIN_LABEL and r.get("unit") is not None}
    requests = [r for r in tr.measured if r["config"] == args.config and r.get("unit") is not None]
    if not requests:
        print(f"no recorded requests of {args.config!r} in {args.run}", file=sys.stderr)
        return 2
    for text in ["cal=recorded", *args.variant]:
        kw = _variant(text)
        cal_name = kw.pop("cal", "recorded")
        ratios = []
        for r in requests:
            info = r["controller"]
            settings = recorded_settings(info["settings"], **kw)
            if cal_name == "recorded":
                cal = Calibration.from_json(info["calibration"]) if info.get("calibration") else None
            elif cal_name in curves:
                cal = curves[cal_name]
            else:
                print(f"unknown cal={cal_name}; use recorded, {', '.join(curves)}", file=sys.stderr)
                return 2
            guard = GoodputGuard(settings, plain_seconds_prior=cal.step_seconds if cal else None)
            ctl = make_controller(settings, dict(info["proposers"]), cal, guard,
                                  info.get("slice", "default"), info.get("token_seconds"))
            x = replay_request(r, ctl, model_for[args.engine], ov.get(args.config))
            base = plain.get(r["unit"])
            if base is not None and base.rate and x.rate:
                ratios.append((r.get("category") or r.get("prompt_id"), x.rate / base.rate))
        print(f"{text:40s} geomean {geometric_mean(v for _, v in ratios):.3f}  worst "
              f"{min(v for _, v in ratios):.3f}  | " + " ".join(f"{c}:{v:.2f}" for c, v in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
