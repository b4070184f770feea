"""The offline replay: recorded text through the same controllers, on a cost curve.

Two questions, one package. Did the cost model predict the run? A bench run recorded
with ``edgespec bench --record`` replays pass for pass through the controllers it built
(replay.py). What would other controllers or proposers have done on the same text? Its
generations (or any prompt + output token traces) replay through any controller
(generations.py). Both cut drafts with the loop's own limit
(:func:`edgespec.control.limit.draft_limit`), accept greedily against the recorded output
(accept.py) and average with :func:`edgespec.api.stats.geometric_mean`.

    record.py   what `edgespec bench --record` keeps per request and pass (a controller
                wrapper on the engine's ``controller_hook``, timings from Step events)
    depth.py    the verify-cost curve measured at several context depths
    cost.py     the replay's cost model (pure): pass seconds by rows and depth, the loop's
                per-pass overheads fitted from the recorded gaps
    replay.py   every recorded request through the controller the engine built, in the
                run's order; predicted vs measured speedups
    report.py   the markdown `edgespec bench --replay RUN_DIR` prints
    accept.py   greedy acceptance against a recorded output (both replays)
    generations.py  any controller over recorded generations (prompt + output) and live or
                recorded proposers on a calibration curve; bounds (foresight, any copy);
                ``python -m edgespec.lab.replay.generations TRACES``

See docs/benchmarks.md, "Replay".
"""
from __future__ import annotations

from .cost import CostModel, DepthCurve, Overheads, fit_overheads, fit_scale
from .replay import compare, load_traces, replay_request, replay_run

__all__ = ["CostModel", "DepthCurve", "Overheads", "compare", "fit_overheads", "fit_scale",
           "load_traces", "replay_request", "replay_run"]
