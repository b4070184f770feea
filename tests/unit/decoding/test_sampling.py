"""sampling.py on literal arrays: llama.cpp penalty/bias semantics, truncation order, RNG policy."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.api.params import SamplingParams
from edgespec.decoding.sampling import distribution, greedy_token, make_rng, process_logits, sample
from edgespec.lab.analysis.stattests import goodness_of_fit

ALPHA = 1e-3  # false-alarm rate of each statistical assertion for a correct implementation


def sp(**kw) -> SamplingParams:
    return SamplingParams(**kw).validate()


# --- penalties and bias -----------------------------------------------------------------

def test_repeat_penalty_divides_positive_and_multiplies_negative():
    logits = np.array([2.0, -1.0, 0.0, 3.0], dtype=np.float32)
    out = process_logits(logits, [0, 1, 2], sp(repeat_penalty=2.0))
    # token 2's logit is 0: llama.cpp treats <= 0 as "multiply", 0 stays 0
    np.testing.assert_array_equal(out, [1.0, -2.0, 0.0, 3.0])


def test_repeat_penalty_counts_each_token_once():
    out = process_logits(np.array([4.0, 1.0]), [0, 0, 0], sp(repeat_penalty=2.0))
    np.testing.assert_array_equal(out, [2.0, 1.0])


def test_penalty_window_is_the_last_repeat_last_n_tokens():
    logits = np.array([4.0, 4.0, 4.0])
    out = process_logits(logits, [0, 1, 2, 2], sp(repeat_penalty=2.0, repeat_last_n=2))
    np.testing.assert_array_equal(out, [4.0, 4.0, 2.0])


def test_repeat_last_n_zero_disables_every_penalty():
    logits = np.array([4.0, 1.0])
    p = sp(repeat_penalty=2.0, frequency_penalty=1.0, presence_penalty=1.0, repeat_last_n=0)
    np.testing.assert_array_equal(process_logits(logits, [0, 0, 1], p), logits)


def test_frequency_and_presence_penalties():
    logits = np.array([5.0, 5.0, 5.0])
    out = process_logits(logits, [0, 0, 0, 1], sp(frequency_penalty=0.5, presence_penalty=1.0))
    # token 0: 5 - 3*0.5 - 1 ; token 1: 5 - 1*0.5 - 1 ; token 2 unseen
    np.testing.assert_array_equal(out, [2.5, 3.5, 5.0])


def test_repeat_then_frequency_presence_are_applied_in_llama_cpp_order():
    out = process_logits(np.array([3.0]), [0, 0], sp(repeat_penalty=1.5, frequency_penalty=0.25,
                                                     presence_penalty=0.5))
    assert out[0] == pytest.approx(3.0 / 1.5 - 2 * 0.25 - 0.5)


def test_logit_bias_applies_before_penalties_and_sums_duplicates():
    logits = np.array([1.0, 1.0, 1.0])
    out = process_logits(logits, [1], sp(logit_bias=((1, -3.0), (2, 0.5), (2, 0.5)), repeat_penalty=2.0))
    # token 1: 1 - 3 = -2, then penalised as a non-positive logit: -4
    np.testing.assert_array_equal(out, [1.0, -4.0, 2.0])


def test_process_logits_does_not_mutate_its_input():
    logits = np.array([1.0, 2.0], dtype=np.float32)
    process_logits(logits, [0, 1], sp(repeat_penalty=3.0, logit_bias=((0, 1.0),)))
    np.testing.assert_array_equal(logits, [1.0, 2.0])


def test_greedy_token_uses_processed_logits():
    logits = np.array([3.0, 2.9, 0.0])
    assert greedy_token(logits, [0], sp()) == 0
    assert greedy_token(logits, [0], sp(repeat_penalty=1.1)) == 1
    assert greedy_token(logits, [], sp(logit_bias=((2, 10.0),))) == 2


def test_greedy_distribution_is_a_point_mass_on_greedy_token():
    p = distribution(np.array([0.1, 2.0, 1.0]), [], sp())
    np.testing.assert_array_equal(p, [0.0, 1.0, 0.0])


# --- truncation -------------------------------------------------------------------------

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))


def test_temperature_one_is_plain_softmax():
    np.testing.assert_allclose(distribution(LOGITS, [], sp(temperature=1.0)),
                               [0.5, 0.2, 0.15, 0.1, 0.05], rtol=1e-12)


def test_temperature_sharpens():
    p = distribution(LOGITS, [], sp(temperature=0.5))
    q = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    np.testing.assert_allclose(p, q / q.sum(), rtol=1e-12)


def test_top_k_keeps_k_best_and_renormalises():
    p = distribution(LOGITS, [], sp(temperature=1.0, top_k=2))
    np.testing.assert_allclose(p, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], rtol=1e-12)


def test_top_k_ties_at_the_cut_keep_the_lower_ids():
    p = distribution(np.array([0.0, 1.0, 0.0, 0.0]), [], sp(temperature=1.0, top_k=2))
    assert p[1] > 0 and p[0] > 0 and p[2] == 0 and p[3] == 0


def test_top_p_keeps_the_token_that_crosses_p():
    # cumulative 0.5, 0.7, 0.85: p=0.6 keeps two tokens, p=0.7 keeps two (reaches exactly), 0.71 three
    assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=1.0, top_p=0.6))) == 2
    assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=1.0, top_p=0.69999))) == 2
    assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=1.0, top_p=0.71))) == 3


def test_top_p_applies_after_top_k_on_renormalised_mass():
    # after top-k=3 the masses are 0.5/0.85, 0.2/0.85, 0.15/0.85 -> cumulative 0.588, 0.824, 1
    assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=1.0, top_k=3, top_p=0.8))) == 2
    assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=1.0, top_k=3, top_p=0.83))) == 3


def test_top_p_and_min_p_use_temperature_one_probabilities():
    # temperature comes last in llama.cpp's chain, so it cannot change which tokens survive
    for t in (0.3, 1.0, 3.0):
        assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=t, top_p=0.6))) == 2
        assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=t, min_p=0.3))) == 3


def test_min_p_is_relative_to_the_best_token():
    # p_max = 0.5: min_p 0.3 keeps p >= 0.15 (three tokens), 0.41 keeps p >= 0.205 (one)
    assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=1.0, min_p=0.3))) == 3
    assert np.count_nonzero(distribution(LOGITS, [], sp(temperature=1.0, min_p=0.41))) == 1


def test_banned_tokens_get_zero_probability():
    p = distribution(LOGITS, [], sp(temperature=1.0, logit_bias=((0, float("-inf")),)))
    assert p[0] == 0.0
    np.testing.assert_allclose(p[1:], np.array([0.2, 0.15, 0.1, 0.05]) / 0.5, rtol=1e-12)


def test_banned_tokens_never_survive_top_k_larger_than_the_live_set():
    bias = tuple((i, float("-inf")) for i in range(3))
    p = distribution(LOGITS, [], sp(temperature=1.0, top_k=4, logit_bias=bias))
    assert p[:3].sum() == 0.0 and p.sum() == pytest.approx(1.0)


def test_all_banned_is_an_error():
    bias = tuple((i, float("-inf")) for i in range(5))
    with pytest.raises(ValueError, match="banned"):
        distribution(LOGITS, [], sp(temperature=1.0, logit_bias=bias))


def test_large_vocabulary_matches_a_full_sort_reference():
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(151_936) * 2.5).astype(np.float32)
    history = rng.integers(0, 151_936, 200).tolist()
    for params in (sp(temperature=0.7, top_k=50), sp(temperature=0.9, top_p=0.5),
                   sp(temperature=1.2, min_p=0.05), sp(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02,
                                                        repeat_penalty=1.1)):
        np.testing.assert_allclose(distribution(logits, history, params),
                                   _reference(logits, history, params), rtol=1e-9, atol=1e-15)


def _reference(logits, history, params):
    """Straightforward full-sort implementation of the same chain, for comparison."""
    x = process_logits(logits, history, params)
    order = np.lexsort((np.arange(x.size), -x))
    keep = order
    if params.top_k:
        keep = keep[: params.top_k]
    if params.top_p < 1.0:
        w = np.exp(x[keep] - x[keep].max())
        cum = np.cumsum(w / w.sum())
        keep = keep[: int(np.argmax(cum >= params.top_p)) + 1]
    if params.min_p > 0.0:
        keep = keep[x[keep] >= x[keep].max() + np.log(params.min_p)]
    out = np.zeros(x.size)
    z = np.exp((x[keep] - x[keep].max()) / params.temperature)
    out[keep] = z / z.sum()
    return out


# --- sampling and RNG -------------------------------------------------------------------

def test_sample_follows_the_distribution():
    probs = np.array([0.5, 0.0, 0.3, 0.15, 0.05])
    rng = make_rng(1234)
    counts = np.bincount([sample(probs, rng) for _ in range(20_000)], minlength=5)
    assert counts[1] == 0
    assert not goodness_of_fit(counts, probs).rejects(ALPHA)


def test_sample_on_a_large_vocabulary_follows_the_distribution():
    # exercises the two-level (block) search, including mass split across blocks
    probs = np.zeros(151_936)
    ids = np.array([0, 1023, 1024, 5000, 151_935])
    probs[ids] = [0.1, 0.2, 0.3, 0.25, 0.15]
    rng = make_rng(99)
    draws = np.array([sample(probs, rng) for _ in range(10_000)])
    assert set(np.unique(draws)) <= set(ids.tolist())
    counts = np.array([(draws == i).sum() for i in ids])
    assert not goodness_of_fit(counts, probs[ids]).rejects(ALPHA)


def test_sample_consumes_exactly_one_uniform():
    a, b = make_rng(5), make_rng(5)
    sample(np.array([0.2, 0.8]), a)
    b.random()
    assert a.random() == b.random()


def test_sample_accepts_unnormalised_weights():
    rng = make_rng(0)
    assert {sample(np.array([0.0, 3.0, 0.0]), rng) for _ in range(50)} == {1}


def test_same_seed_same_stream_is_reproducible_and_streams_differ():
    assert make_rng(42).random(4).tolist() == make_rng(42).random(4).tolist()
    assert make_rng(42).random(4).tolist() != make_rng(42, "draft").random(4).tolist()
    assert make_rng(42).random(4).tolist() != make_rng(43).random(4).tolist()


def test_unknown_stream_is_refused():
    with pytest.raises(ValueError, match="stream"):
        make_rng(1, "bogus")
