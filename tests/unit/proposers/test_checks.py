"""The proposers' option checks (edgespec.proposers.checks): one message shape for every
proposer, whole numbers and fractions only, bools refused."""
import numpy as np
import pytest

from edgespec.errors import InvalidInputError
from edgespec.proposers.checks import check_fraction, check_int


def test_an_integer_in_range_comes_back_as_a_python_int():
    assert check_int("x", 3, 1, 5) == 3 and type(check_int("x", np.int64(5), 1, 5)) is int
    assert check_int("x", 1, 1, 1) == 1


@pytest.mark.parametrize("value, why", [
    (0, r"suffix max_draft=0 is out of range: it must be in \[1, 64\]"),
    (65, r"suffix max_draft=65 is out of range"),
    (True, r"suffix max_draft=True must be an integer in \[1, 64\]"),
    (2.0, r"suffix max_draft=2.0 must be an integer"),
    ("3", r"suffix max_draft='3' must be an integer"),
])
def test_a_bad_integer_is_refused_with_the_option_and_its_range(value, why):
    with pytest.raises(InvalidInputError, match=why):
        check_int("suffix max_draft", value, 1, 64)


def test_fractions_are_numbers_between_zero_and_one():
    assert check_fraction("p", 0) == 0.0 and check_fraction("p", np.float32(0.5)) == 0.5
    for bad in (-0.1, 1.5, True, "0.5", None, float("nan")):
        with pytest.raises(InvalidInputError, match=r"p=.* must be a number in \[0, 1\]"):
            check_fraction("p", bad)


def test_every_free_proposer_refuses_in_the_same_words():
    from edgespec.proposers.lookahead import LookaheadProposer
    from edgespec.proposers.realign import RealignProposer

    for make, name in ((lambda: LookaheadProposer(window=0), "lookahead window=0"),
                       (lambda: RealignProposer(window=0), "realign window=0")):
        with pytest.raises(InvalidInputError, match=f"{name} is out of range: it must be in"):
            make()
