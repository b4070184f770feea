"""The benchmark's oracle proposers: drafts from the plain path's answer, cut on the cost curve."""
import pytest

from edgespec.api.params import SamplingParams
from edgespec.lab.bench.engines import plan_engine
from edgespec.lab.bench.matrix import ConfigSpec, Matrix
from edgespec.lab.replay.generations import best_cut
from edgespec.lab.bench.oracle import ORACLE, ORACLE_COPY, OracleProposer, References, settle
from edgespec.calibration.curve import Calibration
from edgespec.errors import InvalidInputError

GREEDY = SamplingParams(temperature=0.0)


def linear(per_token):
    """A pass of n tokens costs 1 + per_token * (n - 1) steps."""
    return Calibration.linear(per_token)


# this CPU's shape: nearly linear to 15, a cheaper kernel at 16
steep_with_a_cheap_16 = Calibration.from_costs(
    {**{n: 1.0 + 0.7 * (n - 1) for n in range(1, 16)}, 16: 8.7}, 0.04)


def test_the_oracles_cut_takes_the_most_tokens_per_second_or_a_plain_step():
    assert best_cut(linear(0.1), 5) == 5  # flat: draft all that will be accepted
    assert best_cut(linear(1.0), 5) == 0  # each token costs a step: never pays
    assert best_cut(linear(0.5), 0) == 0
    assert best_cut(steep_with_a_cheap_16, 15) == 15  # 16/8.7 beats every shorter pass
    assert best_cut(steep_with_a_cheap_16, 14) == 14
    assert best_cut(linear(2.0), 3) == 0


def _session(kind, prompt, answer, seconds=linear(0.1), max_draft=16):
    refs = References()
    refs.add(prompt, answer)
    p = OracleProposer(kind, refs, seconds, max_draft=max_draft)
    return p, p.open(prompt, GREEDY)


def test_the_oracle_drafts_the_answer_cut_on_the_curve_and_to_what_is_asked():
    _, s = _session(ORACLE, [1, 2, 3], [10, 11, 12, 13, 14])
    assert s.propose(3).tokens == (10, 11, 12)
    s.accept([10, 11, 12], 3)
    assert s.propose(8).tokens == (13, 14)  # never past the answer's end
    _, s = _session(ORACLE, [1], [5, 6, 7], max_draft=2)
    assert s.propose(8).tokens == (5, 6)
    assert all(c == 1.0 for c in s.propose(8).confidence)


def test_the_oracle_stops_drafting_once_the_output_leaves_the_answer():
    _, s = _session(ORACLE, [1, 2], [10, 11, 12, 13])
    s.accept([10, 99], 0)  # a near-tie went the other way in a batched pass
    assert s.propose(4).tokens == ()
    s.accept([5], 0)
    assert s.propose(4).tokens == ()


def test_a_prompt_without_a_reference_drafts_nothing_and_is_counted():
    p, s = _session(ORACLE, [1, 2], [3, 4])
    other = p.open([9, 9], GREEDY)
    assert other.propose(4).tokens == () and p.misses == 1


def test_the_copy_oracle_drafts_only_what_followed_an_earlier_occurrence():
    # prompt: 7 8 9 | 5 7 8 ; answer: 6 7 8 9 4
    prompt, answer = [7, 8, 9, 5, 7, 8], [6, 7, 8, 9, 4]
    _, s = _session(ORACLE_COPY, prompt, answer)
    assert s.propose(8).tokens == ()  # 6 never followed an 8
    s.accept([6], 0)
    # after 6: nothing followed a 6 before -> plain
    assert s.propose(8).tokens == ()
    s.accept([7], 0)
    # after 7: "8 9" followed the first 7 (then 5, not 4)
    assert s.propose(8).tokens == (8, 9)
    s.accept([8, 9, 4], 2)
    assert s.propose(8).tokens == ()  # the answer is complete


def test_the_copy_oracle_picks_the_best_occurrence_and_copies_only_the_past():
    # 3 is followed by "1" and by "4 5 6"; the answer continues "4 5 6 3 4"
    prompt, answer = [3, 1, 0, 3, 4, 5, 6, 0, 3], [4, 5, 6, 3, 4]
    _, s = _session(ORACLE_COPY, prompt, answer)
    assert s.propose(8).tokens == (4, 5, 6)  # "3 4" at the end has not been written yet
    _, s = _session(ORACLE_COPY, prompt, answer, seconds=linear(1.0))
    assert s.propose(8).tokens == ()  # no cut pays on a curve where each token costs a step


def test_an_unknown_oracle_kind_is_refused():
    with pytest.raises(ValueError, match="unknown oracle"):
        OracleProposer("psychic", References(), linear(0.1))


def test_oracle_configurations_run_fixed_control_on_their_own_proposer():
    plan = plan_engine([ConfigSpec("none"), ConfigSpec("oracle"),
                        ConfigSpec.make("oracle-copy", {"max_draft": 8})])
    assert plan.oracles == {"oracle": "oracle", "oracle-copy[max_draft=8]": "oracle-copy"}
    assert plan.request_name["oracle"] == "oracle"
    assert plan.control["oracle"] == {"adaptive": False, "max_draft": 16}
    assert plan.control["oracle-copy[max_draft=8]"] == {"adaptive": False, "max_draft": 8}
    assert not plan.proposer_options and not plan.extra


@pytest.mark.parametrize("knobs", [{"min_n": 2}, {"exact": True}, {"adaptive": True}])
def test_an_oracle_takes_no_other_knobs(knobs):
    with pytest.raises(InvalidInputError, match="an oracle takes only max_draft"):
        plan_engine([ConfigSpec("none"), ConfigSpec.make("oracle", knobs)])


def test_an_oracle_needs_greedy_decoding():
    m = Matrix(target="t", configs=(ConfigSpec("none"), ConfigSpec("oracle-copy")),
               spec_bench=("writing",), temperature=0.7)
    with pytest.raises(InvalidInputError, match="needs temperature 0"):
        m.validate()


def test_settle_replaces_the_reference_until_the_oracle_reproduces_it():
    refs = References()
    outputs = iter([(1, 2, 9, 9), (1, 2, 9, 8), (1, 2, 9, 8)])
    seen = []

    def run():
        seen.append(refs.get([7]))  # what the oracle drafts from in this run
        return next(outputs)

    ref, runs = settle(refs, [7], (1, 2, 3, 4), run)
    assert (ref, runs) == ((1, 2, 9, 8), 3) and refs.get([7]) == ref
    assert seen == [(1, 2, 3, 4), (1, 2, 9, 9), (1, 2, 9, 8)]


def test_settle_gives_up_after_its_runs_and_keeps_the_last_output():
    refs = References()
    n = iter(range(100))
    ref, runs = settle(refs, [7], (0,), lambda: (next(n) + 1,), runs=3)
    assert runs == 3 and ref == (3,) and refs.get([7]) == (3,)
