"""Report arithmetic on literal data: percentiles, paired ratios, geometric means, bootstrap."""
import math

import numpy as np
import pytest

from edgespec.lab.bench.stats import (bootstrap_ci, geometric_mean, histogram_mean, histogram_sum,
                                  paired_ratios, percentile, speedup)


def test_percentile_linear_interpolation_matches_numpy():
    v = [10.0, 1.0, 4.0, 7.0]  # sorted: 1 4 7 10
    assert percentile(v, 0) == 1.0
    assert percentile(v, 100) == 10.0
    assert percentile(v, 50) == pytest.approx(5.5)
    # pos = 3 * 0.95 = 2.85 -> 7 + 0.85 * 3
    assert percentile(v, 95) == pytest.approx(9.55)
    for q in (1, 37, 99):
        assert percentile(v, q) == pytest.approx(float(np.percentile(v, q)))


def test_percentile_edge_cases():
    assert math.isnan(percentile([], 50))
    assert percentile([3.0], 99) == 3.0


def test_geometric_mean():
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert geometric_mean([1.0, 4.0, 16.0]) == pytest.approx(4.0)
    assert math.isnan(geometric_mean([]))
    with pytest.raises(ValueError):
        geometric_mean([1.0, 0.0])


def test_paired_ratios_rate_and_time():
    base = {"a": 10.0, "b": 20.0, "c": 5.0, "d": 0.0}
    cand = {"a": 20.0, "b": 10.0, "d": 3.0, "e": 1.0}
    pr = paired_ratios(base, cand)
    assert pr.ratios == {"a": 2.0, "b": 0.5}
    # c and e have one side only, d has a zero baseline: all excluded and named
    assert set(pr.missing) == {"c", "d", "e"}
    times = paired_ratios({"a": 2.0}, {"a": 1.0}, higher_is_better=False)
    assert times.ratios == {"a": 2.0}


def test_bootstrap_single_cluster_collapses_to_estimate():
    ci = bootstrap_ci([1.5, 2.0], clusters=["q1", "q1"])
    assert ci.estimate == ci.low == ci.high == pytest.approx(math.sqrt(3.0))
    assert ci.n == 2


def test_bootstrap_constant_ratios_give_zero_width():
    ci = bootstrap_ci([1.25] * 7, seed=3)
    assert ci.estimate == ci.low == ci.high == pytest.approx(1.25)


def test_bootstrap_interval_is_seeded_and_contains_estimate():
    ratios = [0.9, 1.1, 1.3, 2.0, 0.8, 1.05, 1.2, 1.6]
    a = bootstrap_ci(ratios, seed=7)
    b = bootstrap_ci(ratios, seed=7)
    assert (a.low, a.high) == (b.low, b.high)
    assert a.low < a.estimate < a.high
    # the interval lies within the range of the data (a geometric mean cannot leave it)
    assert min(ratios) <= a.low and a.high <= max(ratios)
    assert a.estimate == pytest.approx(geometric_mean(ratios))


def test_bootstrap_two_values_interval_spans_both_geometric_means():
    # resamples of {1, 4}: {1,1}->1, {4,4}->4, mixed->2; the 95% interval covers 1..4
    ci = bootstrap_ci([1.0, 4.0], n_resamples=4000, seed=1)
    assert ci.estimate == pytest.approx(2.0)
    assert ci.low == pytest.approx(1.0)
    assert ci.high == pytest.approx(4.0)


def test_bootstrap_clusters_resample_whole_conversations():
    # two conversations: q1's turns both 2.0, q2's both 0.5; resampling clusters can only
    # give all-2, all-0.5 or mixed (=1.0), never 1.0 weighted differently
    ci = bootstrap_ci([2.0, 2.0, 0.5, 0.5], clusters=["q1", "q1", "q2", "q2"], n_resamples=500)
    assert ci.estimate == pytest.approx(1.0)
    assert ci.low == pytest.approx(0.5) and ci.high == pytest.approx(2.0)


def test_bootstrap_rejects_mismatched_clusters():
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], clusters=["a"])


def test_speedup_pairs_then_summarises():
    base = {("p1", 0): 10.0, ("p1", 1): 10.0, ("p2", 0): 20.0}
    cand = {("p1", 0): 20.0, ("p1", 1): 40.0, ("p2", 0): 20.0}
    ci, pr = speedup(base, cand, cluster_of=lambda u: u[0], seed=0)
    assert pr.ratios == {("p1", 0): 2.0, ("p1", 1): 4.0, ("p2", 0): 1.0}
    assert ci.estimate == pytest.approx(2.0)  # (2*4*1)^(1/3)
    assert ci.n == 3


def test_histograms():
    h = histogram_sum([{"1": 3, "2": 1}, {"1": 1, "4": 2}])
    assert h == {1: 4, 2: 1, 4: 2}
    assert histogram_mean(h) == pytest.approx((4 + 2 + 8) / 7)
    assert math.isnan(histogram_mean({}))


def test_bootstrap_fast_path_matches_the_generic_one():
    ratios = [0.9, 1.1, 1.3, 2.0, 0.8, 1.05]
    clusters = ["a", "a", "b", "c", "c", "d"]
    fast = bootstrap_ci(ratios, clusters, seed=11)
    slow = bootstrap_ci(ratios, clusters, statistic=lambda a: geometric_mean(a), seed=11)
    assert (fast.low, fast.high) == pytest.approx((slow.low, slow.high))
    assert fast.estimate == pytest.approx(slow.estimate)
