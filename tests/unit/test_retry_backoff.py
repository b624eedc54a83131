"""Retry backoff (domain/retry.py): ``base * 2**(attempt-1)``, capped, then scaled by the jitter
draw into ``[1 - jitter, 1]`` of itself. The draw is passed in, so every delay is exact."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasehold.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from support.refusals import refused

POLICY = RetryPolicy(base_seconds=2.0, cap_seconds=300.0, jitter=0.5)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


def seconds(delay: timedelta) -> float:
    return delay.total_seconds()


def test_the_default_policy_is_two_seconds_doubling_to_five_minutes_with_half_jitter() -> None:
    assert DEFAULT_RETRY_POLICY == RetryPolicy(base_seconds=2.0, cap_seconds=300.0, jitter=0.5)


@pytest.mark.parametrize(("attempt", "expected"), [(1, 2.0), (2, 4.0), (3, 8.0), (5, 32.0), (8, 256.0)])
def test_without_jitter_the_delay_doubles_with_each_attempt(attempt: int, expected: float) -> None:
    assert seconds(POLICY.delay(attempt, 0.0)) == expected


@pytest.mark.parametrize("attempt", [9, 10, 31, 32, 1000])
def test_the_delay_stops_growing_at_the_cap(attempt: int) -> None:
    """2 * 2**8 = 512 s would be next: the cap holds it at 300 s, however many attempts follow
    (the exponent is bounded too, so a huge attempt number cannot overflow)."""
    assert seconds(POLICY.delay(attempt, 0.0)) == 300.0


def test_the_exponent_stops_at_thirty_so_that_no_attempt_number_overflows() -> None:
    uncapped = RetryPolicy(base_seconds=1.0, cap_seconds=float("inf"), jitter=0.0)
    assert seconds(uncapped.delay(31, 0.0)) == 2.0 ** 30
    assert seconds(uncapped.delay(10**9, 0.0)) == 2.0 ** 30


def test_the_cap_applies_before_the_jitter() -> None:
    """Jitter scales the capped delay, so late retries still spread over [150 s, 300 s]."""
    assert seconds(POLICY.delay(20, 0.5)) == 225.0
    assert 150.0 < seconds(POLICY.delay(20, 0.999)) < 150.2


def test_jitter_scales_the_delay_down_by_the_draw() -> None:
    """draw 0 keeps the full delay, draw 0.5 takes a quarter off (jitter 0.5), draw near 1 nearly half."""
    assert seconds(POLICY.delay(3, 0.0)) == 8.0
    assert seconds(POLICY.delay(3, 0.5)) == 6.0
    nearly_half = seconds(POLICY.delay(3, 0.999))
    assert 4.0 < nearly_half < 4.01
    assert seconds(RetryPolicy(jitter=0.0).delay(3, 0.999)) == 8.0
    assert seconds(RetryPolicy(jitter=1.0).delay(3, 0.75)) == 2.0


@given(attempt=st.integers(min_value=1, max_value=10_000), draw=draws,
       base=st.floats(min_value=0.001, max_value=1000.0), cap=st.floats(min_value=0.001, max_value=10_000.0),
       jitter=st.floats(min_value=0.0, max_value=1.0))
def test_the_delay_never_exceeds_the_cap_nor_falls_below_its_jittered_floor(
        attempt: int, draw: float, base: float, cap: float, jitter: float) -> None:
    policy = RetryPolicy(base_seconds=base, cap_seconds=cap, jitter=jitter)
    delay = seconds(policy.delay(attempt, draw))
    unjittered = min(cap, base * 2 ** min(attempt - 1, 30))
    assert delay <= cap + 1e-6
    assert unjittered * (1 - jitter) - 1e-6 <= delay <= unjittered + 1e-6


@given(attempt=st.integers(min_value=1, max_value=40), low=draws, high=draws)
def test_a_larger_draw_never_gives_a_longer_delay(attempt: int, low: float, high: float) -> None:
    low, high = sorted((low, high))
    assert POLICY.delay(attempt, high) <= POLICY.delay(attempt, low)


@given(attempt=st.integers(min_value=1, max_value=40), draw=draws)
def test_a_later_attempt_never_waits_less_for_the_same_draw(attempt: int, draw: float) -> None:
    assert POLICY.delay(attempt, draw) <= POLICY.delay(attempt + 1, draw)


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempt_numbers_start_at_one(attempt: int) -> None:
    with refused(ValueError, "attempt_number starts at 1"):
        POLICY.delay(attempt, 0.0)


@pytest.mark.parametrize("draw", [-0.001, 1.0, 1.5])
def test_the_draw_is_in_the_half_open_unit_interval(draw: float) -> None:
    with refused(ValueError, "draw must be in [0, 1)"):
        POLICY.delay(1, draw)
