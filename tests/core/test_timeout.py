"""The one timeout rule (pylock._core.timeout), as threading.Lock has it."""

from __future__ import annotations

import decimal
import fractions
import math
import time

import pytest

from pylock._core.timeout import FOREVER_S, check_timeout, deadline_of, ns_left, seconds_left


@pytest.mark.parametrize("forever", [None, -1, -1.0, math.inf, FOREVER_S, 1e300, 2**1000])
def test_forever(forever: object) -> None:
    assert check_timeout(forever) is None
    assert deadline_of(forever) is None
    assert ns_left(None) == -1
    assert seconds_left(None) is None


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (0, 0.0),
        (0.25, 0.25),
        (decimal.Decimal("1.5"), 1.5),
        (fractions.Fraction(1, 4), 0.25),
    ],
)
def test_finite(given: object, seconds: float) -> None:
    assert check_timeout(given) == seconds


@pytest.mark.parametrize("bad", [-2, -0.001, -1e300, -math.inf, math.nan, -math.nan])
def test_other_negatives_and_nan_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout must be None, -1 or a number of seconds >= 0"):
        check_timeout(bad)


@pytest.mark.parametrize("bad", ["1", b"1", [1], object()])
def test_non_numbers_are_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="timeout must be None or a number of seconds"):
        check_timeout(bad)


@pytest.mark.parametrize("bad", [True, False])
def test_a_bool_is_refused_as_the_slip_for_blocking_it_is(bad: bool) -> None:
    # threading.Lock waits 1 s for timeout=True; filelock refuses it, and so does pylock.
    with pytest.raises(TypeError, match=r"not bool .*blocking= is the argument"):
        check_timeout(bad)


def test_nanoseconds_never_overflow_an_int64() -> None:
    long_ago = time.monotonic() - 10
    assert ns_left(long_ago) == 0
    assert seconds_left(long_ago) == 0.0
    far = deadline_of(FOREVER_S * 0.999)
    assert far is not None
    assert 0 < ns_left(far) < 2**63
    assert ns_left(time.monotonic() + 1e30) == -1
