"""Lookahead decoding (edgespec.proposers.lookahead): the pool and the Jacobi update on
literal arrays, the session's use of a pass's rows, bad knobs, the registry's opt-in, and
lossless output on the strict fake backend (greedy, sampling, linear and tree passes)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.api.labels import AUTO
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.calibration.curve import Calibration
from edgespec.control import ControlSettings
from edgespec.errors import InvalidInputError
from edgespec.proposers import REGISTRY, BuildContext, free_names, free_proposer, names, spec
from edgespec.proposers.lookahead import (JACOBI_CONFIDENCE, LookaheadProposer, NgramPool,
                                          jacobi_update, speculative_ngrams)
from fakes import FakeModel, fake_engine, fixed

FLAT = Calibration.linear(0.02, step_seconds=0.02)  # extra rows nearly free (a GPU-like curve)
V = 10  # vocabulary of the literal rows


def rows_for(outputs):
    """Logits whose argmax at row i is outputs[i]."""
    r = np.zeros((len(outputs), V), dtype=np.float32)
    r[np.arange(len(outputs)), outputs] = 5.0
    return r


# --- the pool --------------------------------------------------------------------------------

def test_pool_ranks_by_count_then_recency():
    pool = NgramPool(n=3, g=4)
    pool.add_all([1, 2, 3, 1, 2, 4, 1, 5, 6])
    # (2, 3) and (2, 4) and (5, 6) seen once each: the newest first
    assert pool.candidates(1) == [(5, 6), (2, 4), (2, 3)]
    pool.add([1, 2, 3])
    assert pool.candidates(1)[0] == (2, 3)
    assert pool.share(1, (2, 3)) == pytest.approx(0.5)
    assert pool.candidates(9) == [] and pool.share(9, (1, 1)) == 0.0


def test_pool_keeps_g_per_key_dropping_the_least_seen_oldest():
    pool = NgramPool(n=2, g=2)
    for ng in ([7, 1], [7, 1], [7, 2], [7, 3]):
        pool.add(ng)
    assert pool.candidates(7) == [(1,), (3,)]  # (2,) was seen once and oldest
    assert len(pool) == 2


def test_pool_caps_its_keys_least_recently_fed_first():
    pool = NgramPool(n=2, g=1, max_keys=2)
    pool.add([1, 2])
    pool.add([3, 4])
    pool.add([1, 5])  # key 1 fed again: key 3 is now the oldest
    pool.add([6, 7])
    assert pool.candidates(3) == [] and pool.candidates(1) == [(5,)]  # g=1: the newest
    assert pool.candidates(6) == [(7,)]


def test_pool_add_all_from_a_start_index():
    pool = NgramPool(n=3, g=8)
    pool.add_all([1, 2, 3, 4, 5], start=4)
    assert len(pool) == 1 and pool.candidates(3) == [(4, 5)]


def test_pool_refuses_an_ngram_of_another_size():
    with pytest.raises(InvalidInputError, match="3 tokens, not 2"):
        NgramPool(n=3, g=1).add([1, 2])


# --- the Jacobi update -----------------------------------------------------------------------

@pytest.mark.parametrize("window, outputs, n_new, expected", [
    ([5, 6, 7, 8], [5, 9, 3], 2, [3, 8]),          # 5 accepted, 9 the target's own
    ([5, 6, 7, 8], [4], 1, [6, 7, 8]),             # a plain step: the window shifts
    ([5, 6], [5, 6, 2, 1], 3, [1]),                # the outputs reach past the window
    ([], [3, 4, 5], 3, []),                        # all accepted: nothing guessed past
])
def test_jacobi_update(window, outputs, n_new, expected):
    assert jacobi_update(window, outputs, n_new) == expected


def test_speculative_ngrams_take_the_n_minus_1_inputs_before_each_row():
    # context ends with the pending token 2; draft 3 4 5; outputs after 2, 3, 4, 5
    got = speculative_ngrams([0, 1, 2], [3, 4, 5], [3, 9, 8, 7], n=3, first_row=2)
    assert got == [(3, 4, 8), (4, 5, 7)]
    # n = 4 reaches back into the context; rows that would start before it are skipped
    assert speculative_ngrams([2], [3, 4], [3, 9, 8], n=4, first_row=0) == [(2, 3, 4, 8)]


# --- the session -----------------------------------------------------------------------------

def test_propose_starts_with_the_pools_candidate_then_the_window():
    s = LookaheadProposer(n=3, window=4, pool=2).open([1, 2, 3, 1, 2, 4, 1], SamplingParams())
    d = s.propose(5)
    assert d.tokens[:2] in ((2, 3), (2, 4)) and len(d.tokens) == 4  # candidate + window tail
    assert d.source == "pool" and d.match_length == 1
    assert d.confidence[:2] == (0.5, 0.5) and d.confidence[2:] == (JACOBI_CONFIDENCE,) * 2
    assert s.propose(1).tokens == d.tokens[:1]  # deterministic within a step
    assert s.propose(0).tokens == ()


def test_without_a_candidate_the_window_is_the_draft():
    s = LookaheadProposer(n=3, window=3, pool=2).open([1, 2, 3], SamplingParams())
    d = s.propose(8)
    assert d.source == "jacobi" and len(d.tokens) == 3
    assert set(d.tokens) <= {1, 2, 3}  # seeded from the prompt
    assert d.confidence == (JACOBI_CONFIDENCE,) * 3


def test_a_pass_s_speculative_rows_update_the_window_and_feed_the_pool():
    s = LookaheadProposer(n=3, window=4, pool=4).open([1, 2, 3], SamplingParams())
    s.propose(4)
    s._window = [4, 5, 6, 7]
    # the pass evaluated pending 3 and the draft 4 5 6; the target said 4, then 8 (5 was
    # wrong), then 9 after the guessed 5 and 1 after the guessed 6
    s.observe_pass([3, 4, 5, 6], rows_for([4, 8, 9, 1]))
    s.accept([4, 8], 1)
    assert s.window == [9, 1]  # positions after the new pending token 8 (7 was replaced)
    assert s.jacobi_ngrams == 2
    assert (5, 9) in s.pool.candidates(4) and (6, 1) in s.pool.candidates(5)
    assert (4, 8) in s.pool.candidates(3)  # the output's own n-gram


def test_rows_of_another_pass_are_ignored():
    s = LookaheadProposer(n=3, window=3).open([1, 2, 3], SamplingParams())
    s.observe_pass([7, 4], rows_for([4, 5]))  # not the pending token
    s.accept([4], 0)
    assert s.jacobi_ngrams == 0
    s.observe_pass([4, 5], rows_for([6]))  # one row for two inputs
    s.accept([6], 0)
    assert s.jacobi_ngrams == 0
    s.observe_pass([6, 5, 5], rows_for([5, 2, 2]))  # accept does not match the draft
    s.accept([1, 2], 1)
    assert s.jacobi_ngrams == 0


def test_tree_holds_the_linear_draft_first_then_other_candidates():
    s = LookaheadProposer(n=3, window=2, pool=4).open([1, 2, 3, 1, 5, 6, 1], SamplingParams())
    linear = s.propose(4)
    tree = s.propose_tree(4, 4)
    assert tree.tokens[:len(linear.tokens)] == linear.tokens
    assert len(tree) == 4 and tree.width == 2


def test_a_closed_session_proposes_nothing():
    s = LookaheadProposer().open([1, 2], SamplingParams())
    s.close(True)
    assert s.propose(4).tokens == ()
    s.accept([3], 0)  # harmless


# --- bad input and the registry --------------------------------------------------------------

@pytest.mark.parametrize("opts, message", [
    ({"n": 1}, r"n=1 is out of range: it must be in \[2, 8\]"),
    ({"n": 9}, r"n=9 is out of range"),
    ({"window": 0}, r"window=0 is out of range: it must be in \[1, 64\]"),
    ({"pool": 0}, r"pool=0 is out of range"),
    ({"max_draft": 0}, r"max_draft=0 is out of range"),
    ({"n": 2.5}, r"n=2.5 must be an integer"),
])
def test_bad_knobs_are_clear_errors(opts, message):
    with pytest.raises(InvalidInputError, match=message):
        LookaheadProposer(**opts)


def test_the_registry_builds_it_and_checks_its_options():
    assert "lookahead" in names()
    p = free_proposer("lookahead", n="4", window="6")
    assert (p.n, p.window, p.name) == (4, 6, "lookahead")
    with pytest.raises(InvalidInputError, match="lookahead option window='x' is not a int"):
        spec("lookahead").check_options({"window": "x"})
    with pytest.raises(InvalidInputError, match="window=0 is out of range"):
        spec("lookahead").build(BuildContext(), {"window": "0"})
    with pytest.raises(InvalidInputError, match="unknown lookahead option"):
        spec("lookahead").check_options({"levels": 3})


def test_auto_does_not_weigh_it_until_measured():
    from edgespec.planner.search import _kinds
    assert REGISTRY["lookahead"].asked_only and not REGISTRY["lookahead"].own_model
    assert "lookahead" not in free_names()
    assert "lookahead" not in [k for k, _ in _kinds(AUTO, has_draft=False)]
    assert _kinds("lookahead", has_draft=False) == [("lookahead", False)]


# --- lossless on the strict fake backend ------------------------------------------------------

def _run(eng, params):
    return eng.generate("abc", params)


def _plain(params):
    return _run(fake_engine(FakeModel(), {}), params).tokens


@pytest.mark.parametrize("control", [fixed(4), ControlSettings(adaptive=True)],
                         ids=["fixed4", "adaptive"])
def test_greedy_output_is_the_plain_path(control):
    params = GenerationParams(chat=False, max_tokens=60)
    prop = LookaheadProposer(n=3, window=6)
    eng = fake_engine(FakeModel(), {"lookahead": prop}, control=control, calibration=FLAT)
    res = _run(eng, params)
    assert res.tokens == _plain(params)
    assert res.stats.drafted > 0


def test_jacobi_rows_reach_the_session_and_drafts_get_accepted():
    model = FakeModel()
    prop = LookaheadProposer(n=3, window=6)
    opened = []
    orig = prop.open
    prop.open = lambda toks, sp: opened.append(orig(toks, sp)) or opened[-1]  # type: ignore
    eng = fake_engine(model, {"lookahead": prop}, control=fixed(5), calibration=FLAT)
    res = _run(eng, GenerationParams(chat=False, max_tokens=60))
    assert opened and opened[0].jacobi_ngrams > 0
    assert res.stats.accepted > 0


def test_sampling_is_the_plain_path_s_sample_for_the_same_seed():
    """Point-mass drafts draw one uniform per emitted token, so a seed gives the plain
    path's sample token for token (edgespec.decoding.verify)."""
    params = GenerationParams(chat=False, max_tokens=50,
                              sampling=SamplingParams(temperature=1.0, seed=11))
    eng = fake_engine(FakeModel(), {"lookahead": LookaheadProposer(n=3)}, control=fixed(4),
                      calibration=FLAT)
    assert _run(eng, params).tokens == _plain(params)


def test_tree_passes_verify_pool_candidates_losslessly():
    eng = fake_engine(FakeModel(), {"lookahead": LookaheadProposer(n=3, window=4)},
                      calibration=FLAT, parallel=3, control=ControlSettings(adaptive=True))
    eng._loop.tree_seqs = (1, 2)  # what the engine would set aside for branches
    params = GenerationParams(chat=False, max_tokens=60)
    res = _run(eng, params)
    assert res.tokens == _plain(params)
    assert res.stats.tree_passes > 0
    assert eng.ctx.tokens(1) == [] and eng.ctx.tokens(2) == []


# --- the bench and the simulator ---------------------------------------------------------------

def test_the_bench_builds_it_when_a_configuration_names_it():
    from edgespec.lab.bench.matrix import ConfigSpec
    from edgespec.lab.bench.engines import plan_engine
    plan = plan_engine([ConfigSpec("none"), ConfigSpec("lookahead")])
    assert plan.proposer_options == {"lookahead": {}}
    plan = plan_engine([ConfigSpec("none"), ConfigSpec.make("lookahead", {"n": 3})])
    assert plan.proposer_options == {"lookahead": {"n": 3}}


def test_the_simulator_replays_it_on_a_flat_curve():
    """A trace holds the output, not the target's rows on guessed prefixes: replayed, the
    proposer drafts from its pool over the prompt and the output (no Jacobi rows)."""
    from edgespec.lab.replay.generations import Trace, compare, native_proposers, standard_configs
    words = [3, 4, 5, 6, 7, 8]
    t = Trace("rep", tuple(words * 3), tuple(words * 6))
    table = compare([t], FLAT, native_proposers(["lookahead"], {"lookahead": {"n": 4}}),
                    standard_configs(FLAT, ["lookahead"]))
    assert table["adaptive"]["rep"] > 1.5  # copies of a repeated phrase verify almost free


def test_the_module_s_examples_hold():
    import doctest

    import edgespec.proposers.lookahead as mod
    assert doctest.testmod(mod).failed == 0


@pytest.mark.parametrize("label, options, built", [
    (AUTO, {}, False), ("ngram", {}, False), ("lookahead", {}, True),
    ("ngram+lookahead", {}, True), (AUTO, {"lookahead": {"n": 3}}, True),
])
def test_the_engine_builds_it_only_when_asked(label, options, built):
    from contextlib import ExitStack

    from edgespec.config import EngineConfig
    from edgespec.engine.build import _build_proposers
    config = EngineConfig(target="fake.gguf", proposer=label, proposer_options=options)
    with ExitStack() as stack:
        out = _build_proposers(config, options, stack, BuildContext())
    assert ("lookahead" in out) == built
    if options:
        assert out["lookahead"].n == 3
