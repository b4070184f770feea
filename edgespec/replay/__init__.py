"""Record a bench run's passes and replay them on the run's own cost curves.

    record.py   what `edgespec bench --record` keeps per request and pass (a controller
                wrapper on the engine's ``controller_hook``, timings from Step events)
    depth.py    the verify-cost curve measured at several context depths
    cost.py     the replay's cost model (pure): pass seconds by rows and depth, the loop's
                per-pass overheads fitted from the recorded gaps
    replay.py   every recorded request through the controller the engine built, in the
                run's order; predicted vs measured speedups
    report.py   the markdown `edgespec bench --replay RUN_DIR` prints

See docs/benchmarks.md, "Replay".
"""
from __future__ import annotations

from .cost import CostModel, DepthCurve, Overheads, fit_overheads, fit_scale
from .replay import compare, load_traces, replay_request, replay_run

__all__ = ["CostModel", "DepthCurve", "Overheads", "compare", "fit_overheads", "fit_scale",
           "load_traces", "replay_request", "replay_run"]
