"""The acceptance a draft needs to pay on a device's verify curve (control.breakeven)."""
import pytest

from edgespec.api.stats import RequestStats
from edgespec.calibration.breakeven import BreakEven, emitted, needed_acceptance, why_idle

# this machine's curve (edgespec plan): 2/4/8/16-token passes cost 1.89/3.41/5.22/6.08 steps
CURVE = {1: 1.0, 2: 1.89, 4: 3.41, 8: 5.22, 16: 6.08, 17: 6.3}


def cost(n: float) -> float:
    pts = sorted(CURVE.items())
    for (n0, c0), (n1, c1) in zip(pts, pts[1:]):
        if n0 <= n <= n1:
            return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
    raise AssertionError(n)


def test_emitted_tokens_per_pass():
    assert emitted(0.0, 4) == 1.0
    assert emitted(1.0, 4) == 5.0
    assert emitted(0.5, 1) == pytest.approx(1.5)


def test_a_free_proposer_needs_what_the_one_token_pass_costs_beyond_a_step():
    be = needed_acceptance(cost, 0.0, ks=[1])
    assert be.k == 1 and be.acceptance == pytest.approx(0.89, abs=1e-6)


def test_the_easiest_length_is_chosen_over_the_curve():
    be = needed_acceptance(cost, 0.0)
    # long passes are nearly flat here: a 16-token draft pays from a lower acceptance
    assert be.acceptance is not None and be.acceptance < 0.89 and be.k > 4


def test_a_draft_model_at_0_7_steps_a_token_never_pays_on_this_curve():
    be = needed_acceptance(cost, 0.70)
    assert be.acceptance is None


def test_the_line_says_why_and_what_would_change_it():
    never = BreakEven(1, None, 1.89, 0.70)
    line = why_idle("draft", 3, 80, 2, never)
    assert "drafted 3 of 80" in line and "even if every drafted token is accepted" in line
    some = BreakEven(15, 0.62, 6.08, 0.0)
    line = why_idle("ngram", 2, 80, 1, some)
    assert "at least 62%" in line and "accepted 50%" in line
    assert why_idle("ngram", 40, 80, 30, some) is None  # it drafted its share
    assert why_idle("none", 0, 80, 0, some) is None  # the plain path asked for nothing


def test_plain_path_stats_show_only_what_applies():
    s = RequestStats(proposer="none")
    s.observe_step(proposer=None, drafted=0, accepted=0, emitted=1, draft_seconds=0.0,
                   verify_seconds=0.01, elapsed=0.01)
    text = s.summary()
    assert "acceptance" not in text and "histogram" not in text and "by position" not in text
    s2 = RequestStats(proposer="ngram")
    s2.observe_step(proposer="ngram", drafted=3, accepted=2, emitted=3, draft_seconds=0.0,
                    verify_seconds=0.02, elapsed=0.02)
    assert "acceptance 2/3" in s2.summary()
