"""The one geometric mean (edgespec.api.stats.geometric_mean) the bench, replay and analysis share."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgespec.api.stats import geometric_mean
from edgespec.lab.bench import stats as bench_stats


def test_values():
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert geometric_mean([1.0, 4.0, 16.0]) == pytest.approx(4.0)
    assert geometric_mean([3.0]) == pytest.approx(3.0)


def test_takes_any_iterable():
    assert geometric_mean(x for x in (1.0, 4.0)) == pytest.approx(2.0)
    assert geometric_mean({"a": 9.0, "b": 1.0}.values()) == pytest.approx(3.0)
    assert geometric_mean(np.array([1.0, 100.0])) == pytest.approx(10.0)


def test_empty_is_nan():
    assert math.isnan(geometric_mean([]))
    assert math.isnan(geometric_mean(iter(())))


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_non_positive_or_non_finite_raises(bad):
    with pytest.raises(ValueError, match="positive finite"):
        geometric_mean([1.0, bad])


def test_bench_uses_the_same_function():
    # bootstrap_ci vectorises the statistic when it *is* the geometric mean
    assert bench_stats.geometric_mean is geometric_mean
