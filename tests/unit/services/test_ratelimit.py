"""The token bucket: its limit per key, and a bounded number of keys however many come."""

from __future__ import annotations

import pytest

from app.domain.ratelimit import RateLimited, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_gets_its_burst_then_429_with_the_wait_until_the_next_token() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    for _ in range(3):
        limiter.take("a")
    with pytest.raises(RateLimited) as refused:
        limiter.take("a", who="this address")
    assert refused.value.retry_after == 1
    assert refused.value.detail() == "rate limit exceeded for this address"
    limiter.take("b")  # another key, its own bucket
    clock.now = 0.5
    limiter.take("a")


def test_many_keys_keep_a_bounded_number_of_buckets_and_the_limited_ones_stay_limited() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=2, clock=clock, max_keys=100)
    limiter.take("attacker")
    limiter.take("attacker")
    for i in range(10_000):  # one request from each of many addresses
        clock.now += 0.00001
        limiter.take(f"192.0.2.{i}")
        assert len(limiter) <= 100
    with pytest.raises(RateLimited):
        limiter.take("attacker")  # the emptiest buckets are the ones kept
