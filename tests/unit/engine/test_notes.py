"""The line front ends print when a proposer the user asked for stayed (mostly) off."""
from types import SimpleNamespace

from edgespec.api.stats import RequestStats
from edgespec.calibration.curve import Calibration
from edgespec.engine.notes import idle_reason

CURVE = Calibration.from_costs({1: 1.0, 2: 1.89, 4: 3.41, 8: 5.22, 16: 6.08}, step_seconds=0.034)


def _engine(adaptive=True, cal=CURVE, per_token=0.0):
    return SimpleNamespace(
        config=SimpleNamespace(control=SimpleNamespace(adaptive=adaptive)),
        calibration=lambda: cal,
        proposers={"draft": SimpleNamespace(seconds_per_token=per_token)})


def _stats(proposer, drafted, generated, accepted=0, draft_seconds=0.0):
    s = RequestStats(proposer=proposer)
    s.generated_tokens, s.drafted, s.accepted = generated, drafted, accepted
    s.draft_seconds = draft_seconds
    return s


def test_a_draft_that_cannot_pay_here_says_so_from_its_measured_cost():
    line = idle_reason(_engine(per_token=0.024), _stats("draft", 0, 80))
    assert "draft drafted 0 of 80" in line and "even if every drafted token is accepted" in line


def test_a_free_proposer_gets_the_acceptance_it_needs():
    line = idle_reason(_engine(), _stats("ngram", 2, 80, accepted=1))
    assert "at least" in line and "accepted 50%" in line and "on this machine" in line


def test_nothing_to_say_for_the_plain_path_a_busy_proposer_or_a_fixed_controller():
    assert idle_reason(_engine(), _stats("none", 0, 80)) is None
    assert idle_reason(_engine(), _stats("ngram", 40, 80, accepted=30)) is None
    assert idle_reason(_engine(adaptive=False), _stats("ngram", 0, 80)) is None
