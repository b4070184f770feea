"""The adaptive controller under continuous batching: a draft is priced by how much it grows
the pass the other sequences already share (edgespec.control.adaptive)."""
from __future__ import annotations

from edgespec.calibration.curve import Calibration
from edgespec.control import AdaptiveController, ControlSettings, StepView
from edgespec.proposers.base import Draft

# a 4-token confident match, as the suffix proposer gives on a repetitive stretch
DRAFT = Draft(tokens=(5, 6, 7, 8), confidence=(0.95, 0.95, 0.9, 0.9), match_length=12)


def decide(cal: Calibration, rows: int = 0, tokens: float = 0.0):
    ctl = AdaptiveController({"suffix": False}, cal, ControlSettings(guard=False))
    return ctl.decide(StepView(generated=10, remaining=100, candidates={"suffix": DRAFT},
                               batch_rows=rows, batch_tokens=tokens))


def test_a_compute_bound_device_drafts_alone_and_yields_in_a_full_pass():
    # every extra row costs 0.45 of a step (this CPU's slope): a good draft pays alone
    cpu = Calibration.linear(0.45, step_seconds=0.04)
    alone = decide(cpu)
    assert not alone.plain and alone.k >= 1
    # seven other sequences already share the pass, each emitting a token: the same draft
    # would slow all of them for its own gain
    loaded = decide(cpu, rows=7, tokens=7.0)
    assert loaded.plain


def test_where_extra_rows_are_nearly_free_drafts_survive_the_load():
    gpu = Calibration.linear(0.01, step_seconds=0.01)
    loaded = decide(gpu, rows=7, tokens=7.0)
    assert not loaded.plain and loaded.k >= 2


def test_drafts_shrink_as_the_pass_fills():
    cpu = Calibration.linear(0.2, step_seconds=0.04)
    ks = [decide(cpu, rows=b, tokens=float(b)).k for b in (0, 2, 6, 14)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
