"""An :class:`edgespec.engine.Engine` over the fake backend, built without loading anything."""
from __future__ import annotations

from typing import Mapping, Sequence

from edgespec.calibration.curve import Calibration
from edgespec.api.labels import PLAIN
from edgespec.config import EngineConfig
from edgespec.control import ControlSettings
from edgespec.engine.engine import Engine

from .backend import FakeModel

#: a fixed cost curve (each extra token in a pass costs 0.1 of a step), so adaptive
#: control decides without measuring anything
CALIBRATION = Calibration.linear(0.1, step_seconds=0.02)


def fixed(k: int) -> ControlSettings:
    """Every step drafts k tokens: what the loop tests need to be deterministic."""
    return ControlSettings(adaptive=False, max_draft=k)


def fake_engine(model: FakeModel | None = None, proposers: Mapping[str, object] | None = None, *,
                proposer: str | None = None, n_ctx: int = 256, n_batch: int = 64,
                control: ControlSettings | None = None, calibration: Calibration | None = CALIBRATION,
                sinks: Sequence = (), exact: bool = False, parallel: int = 1,
                kv_cache_ram: int | None = None) -> Engine:
    """An engine serving ``model`` with ``proposers``; the default request label uses all
    of them (``"a+b"``), or the plain path when there are none."""
    model = model or FakeModel()
    proposers = dict(proposers or {})
    label = proposer or ("+".join(proposers) or PLAIN)
    ctx = model.new_context(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=parallel)
    config = EngineConfig(target=model.path.name, proposer=label, exact=exact, n_ctx=n_ctx,
                          control=control or fixed(3), parallel=parallel,
                          kv_cache_ram=kv_cache_ram)
    return Engine(model, ctx, config=config, proposers=proposers, calibration=calibration,
                  sinks=sinks, default_proposer=label)
