"""Failed authentications per source: a burst, then held to the rate before any token is read."""

from __future__ import annotations

import pytest

from app.domain.ratelimit import FailureLimit, RateLimited, RateLimiter, source_key


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def checks_let_through(limit: FailureLimit, source: str, n: int) -> int:
    """Send ``n`` bad tokens from ``source``: how many were checked (and failed)."""
    checked = 0
    for _ in range(n):
        try:
            limit.check(source)
        except RateLimited:
            continue
        checked += 1
        limit.failed(source)
    return checked


def test_a_source_fails_its_burst_then_is_refused_without_a_check_until_the_bucket_refills() -> None:
    clock = Clock()
    limit = FailureLimit(RateLimiter(1.0, 5, clock=clock), clock=clock)
    assert checks_let_through(limit, "192.0.2.1", 100) == 5
    with pytest.raises(RateLimited) as refused:
        limit.check("192.0.2.1")
    assert refused.value.retry_after == 1
    assert refused.value.detail() == "rate limit exceeded for failed authentications from this address"
    limit.check("192.0.2.2")  # another source is not held back
    clock.now = 10.0  # ten failures' worth, at one per second
    assert checks_let_through(limit, "192.0.2.1", 100) == 5  # capped at the burst
    clock.now = 11.0
    assert checks_let_through(limit, "192.0.2.1", 100) == 1


def test_a_check_that_succeeds_spends_nothing() -> None:
    clock = Clock()
    limit = FailureLimit(RateLimiter(1.0, 2, clock=clock), clock=clock)
    for _ in range(1000):
        limit.check("192.0.2.1")  # good tokens: never failed
    assert checks_let_through(limit, "192.0.2.1", 10) == 2


class SharedBucket:
    """A limit shared by replicas (as SharedRateLimiter is), each with its own front in memory."""

    def __init__(self, burst: int, clock: Clock) -> None:
        self.shared = RateLimiter(1.0, burst, clock=clock)
        self.local = RateLimiter(1.0, burst, clock=clock)

    def take(self, key: str, *, who: str = "this token") -> None:
        self.local.take(key, who=who)
        self.shared.take(key, who=who)


def test_failures_at_other_replicas_bar_the_source_here_too() -> None:
    clock = Clock()
    shared = RateLimiter(1.0, 6, clock=clock)
    a, b = SharedBucket(6, clock), SharedBucket(6, clock)
    a.shared = b.shared = shared
    here, there = FailureLimit(a, clock=clock), FailureLimit(b, clock=clock)
    assert checks_let_through(here, "192.0.2.1", 3) + checks_let_through(there, "192.0.2.1", 3) == 6
    assert checks_let_through(here, "192.0.2.1", 50) == 1  # the one the shared bucket refused, then barred
    assert checks_let_through(there, "192.0.2.1", 50) == 1
    with pytest.raises(RateLimited):
        here.check("192.0.2.1")


def test_an_ipv6_source_is_its_64_and_an_ipv4_mapped_one_its_ipv4_address() -> None:
    assert source_key("2001:db8:1:2:aaaa::1") == source_key("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::/64"
    assert source_key("::ffff:192.0.2.1") == source_key("192.0.2.1") == "192.0.2.1"
    assert source_key("testclient") == "testclient"
    clock = Clock()
    limit = FailureLimit(RateLimiter(1.0, 3, clock=clock), clock=clock)
    picked = [f"2001:db8:1:2::{i:x}" for i in range(100)]  # a new address in the /64 for each try
    assert sum(checks_let_through(limit, address, 1) for address in picked) == 3


def test_bars_are_bounded_however_many_sources_fail() -> None:
    clock = Clock()
    limit = FailureLimit(RateLimiter(0.001, 1, clock=clock, max_keys=1_000_000), clock=clock, max_keys=100)
    for i in range(5_000):
        checks_let_through(limit, f"10.0.{i // 256}.{i % 256}", 1)
        limit.failed(f"10.0.{i // 256}.{i % 256}")  # the second failure bars it
        assert len(limit._barred) <= 100
