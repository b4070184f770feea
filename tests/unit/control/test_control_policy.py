from edgespec.control import AcceptanceModel, Feature
def test_evidence_is_counted_once_across_the_levels():
    m = AcceptanceModel(window=1e9, position_calibration=False)
    m.rescale = False
    f = Feature(("m", 2), 0.35)
    for _ in range(3):
        m.record([f], accepted=1, state=True)
    p = m.predict([f], state=True)[0]
    once = (3 + 6 * 0.35) / (3 + 6)
    assert abs(p - once) < 1e-3, p


# --- the policy choice, in the simulator on recorded-like traces ------------------------
import random

import pytest

from edgespec.calibration.curve import Calibration
from edgespec.control import AdaptiveController, ControlSettings, FixedController, GoodputGuard
from edgespec.control.policy import PolicyChooser
from edgespec.proposers.base import EMPTY_DRAFT, Draft
from edgespec.lab.replay.generations import Trace, replay

STEEP = Calibration.from_costs({2: 1.7, 4: 2.6, 8: 4.6, 16: 5.1}, step_seconds=0.08)
FLAT = Calibration.from_costs({2: 1.02, 4: 1.05, 8: 1.12, 16: 1.3}, step_seconds=0.02)
N = 320


def _runs(seed, run, gap, p_match):
    """Right/wrong flags of an output: runs the proposer copies, gaps it gets wrong."""
    rng = random.Random(seed)
    flags = []
    while len(flags) < N + 32:
        flags += [True] * rng.randint(*run) if rng.random() < p_match else []
        flags += [False] * rng.randint(*gap)
    return flags


def family(kind: str, seed: int = 0):
    """(trace, proposer): a synthetic output and a proposer drafting it like the real ones."""
    rng = random.Random(seed)
    trace = Trace(kind, tuple(rng.randrange(10_000) for _ in range(16)),
                  tuple(rng.randrange(10_000) for _ in range(N)))
    if kind == "copying":  # long exact runs (extraction, summarization quoting its input)
        flags, match = _runs(seed, (30, 80), (1, 3), 1.0), 12
    elif kind == "code":  # code edits: stretches of the input kept, then the edit
        flags, match = _runs(seed, (6, 25), (3, 10), 0.9), 6
    elif kind == "open":  # open-ended: rare short matches
        flags, match = _runs(seed, (1, 3), (8, 30), 0.4), 2
    else:  # adversarial: long matches claimed, broken at the first token
        flags, match = [False] * (N + 32), 12
    out, base = trace.output, len(trace.prompt)

    def propose(history, k):
        pos = len(history) - base
        if pos >= len(out) or (kind == "open" and not flags[pos] and rng.random() < 0.7):
            return EMPTY_DRAFT  # open text: most positions have no match at all
        toks = []
        for i in range(pos, pos + k):
            if i < len(out) and flags[i]:
                toks.append(out[i])
            else:
                toks += [-1 - j for j in range(k - len(toks))]
                break
        return Draft(tokens=tuple(toks), match_length=match)
    return trace, propose


def goodput(trace, make, cal, kind, seed):
    trace, prop = family(kind, seed)
    res = replay(trace, make(), cal, {"ngram": prop})
    return res.tokens / res.seconds, res


@pytest.mark.parametrize("cal", [STEEP, FLAT], ids=["steep-cpu", "flat-gpu"])
@pytest.mark.parametrize("kind", ["copying", "code", "open", "adversarial"])
def test_the_default_never_loses_to_a_cap_it_could_have_chosen(cal, kind):
    for seed in (0, 1):
        default, res = goodput(None, lambda: AdaptiveController(
            {"ngram": False}, cal, ControlSettings(policy=True), GoodputGuard(plain_seconds_prior=cal.step_seconds)),
            cal, kind, seed)
        caps = {k: goodput(None, lambda k=k: FixedController("ngram", k), cal, kind, seed)[0]
                for k in (1, 2, 3, 4, 8)}
        plain = 1.0 / cal.seconds(1)
        best = max(caps.values())
        assert default >= 0.98 * best, (kind, seed, default * cal.step_seconds,
                                        {k: v * cal.step_seconds for k, v in caps.items()})
        assert default >= 0.97 * plain, (kind, seed, default * cal.step_seconds)
