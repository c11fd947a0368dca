"""Rate limits (token bucket): 429 with Retry-After when exceeded.

Keyed by API token, for anonymous negotiations by client address and in total, and for
the tunnel agent (whose requests carry no token) by source address and by verified user;
failed authentications by source address (:class:`FailureLimit`).

:class:`RateLimiter` keeps its buckets in the process: the one process of a SQLite
database. Replicas sharing a PostgreSQL database count in the database as well
(:class:`app.adapters.db.ratelimit.SharedRateLimiter`), so a client gets the configured
rate whichever replica it reaches.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from typing import Protocol

from app.domain.errors import QossError
from app.domain.ports import Clock

__all__ = ["FailureLimit", "Overloaded", "RateLimited", "RateLimiter", "source_key"]


class RateLimited(QossError):
    """Too many requests for this token: retry after ``retry_after`` seconds (429)."""

    def __init__(self, retry_after: float, *, who: str = "this token") -> None:
        super().__init__(f"rate limit exceeded for {who}")
        self.retry_after = max(1, math.ceil(retry_after))


class Overloaded(QossError):
    """The process is at one of its limits of work at once: retry after ``retry_after`` seconds (503)."""

    def __init__(self, detail: str, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class RateLimiter:
    """``rate`` requests per second on average, bursts of up to ``burst``, per key.

    At most ``max_keys`` buckets are kept, however many keys (client addresses) come: past
    it, the buckets that have refilled (the same as no bucket) are forgotten, and if that is
    not enough, all but the emptiest half, so that a key being held back stays held back.
    """

    def __init__(self, rate: float, burst: int, clock: Clock = time.monotonic,
                 max_keys: int = 100_000) -> None:
        self._rate, self._burst, self._clock, self._max_keys = rate, burst, clock, max_keys
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def _forget(self, now: float) -> None:
        """Make room (called with the lock held, when there are more than ``max_keys`` buckets)."""
        def tokens(item: tuple[str, tuple[float, float]]) -> float:
            held, last = item[1]
            return held + (now - last) * self._rate

        full = float(self._burst)
        kept = [item for item in self._buckets.items() if tokens(item) < full]
        if len(kept) > self._max_keys // 2:  # keep the emptiest: those a limit is holding back
            kept = sorted(kept, key=tokens)[: self._max_keys // 2]
        self._buckets = dict(kept)

    def wait(self, key: str) -> float:
        """Seconds until ``key``'s bucket holds a request (0: it holds one now); spends nothing."""
        now = self._clock()
        with self._lock:
            held = self._buckets.get(key)
        if held is None:
            return 0.0
        tokens = min(float(self._burst), held[0] + (now - held[1]) * self._rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / self._rate

    def take(self, key: str, *, who: str = "this token") -> None:
        """Spend one request for ``key``.

        Args:
            key: whose bucket.
            who: how the refusal names the caller ("this token", "this user").

        Raises:
            RateLimited: the bucket is empty.
        """
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(self._burst), now))
            tokens = min(float(self._burst), tokens + (now - last) * self._rate)
            if tokens < 1:
                self._buckets[key] = (tokens, now)
                raise RateLimited((1 - tokens) / self._rate, who=who)
            self._buckets[key] = (tokens - 1, now)
            if len(self._buckets) > self._max_keys:
                self._forget(now)


class _Limit(Protocol):
    def take(self, key: str, *, who: str = ...) -> None: ...


def source_key(address: str) -> str:
    """The key of a client address in limits that count its failures: the address itself, or
    for IPv6 its /64 (one host or site is given a whole /64 and can pick any address in it)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)


class FailureLimit:
    """Failed authentications per source: past a burst, the source's tokens are not looked at.

    Each failure spends one request of ``limit`` (a :class:`RateLimiter`, or a limit shared by
    every replica with one in front of it as ``local``, as
    :class:`app.adapters.db.ratelimit.SharedRateLimiter` has). :meth:`check`, before a token
    is read, refuses a source whose bucket is empty, without spending: so after its burst a
    source's failed checks are held to the limit's rate whatever it sends, and other sources
    are not slowed at all. A failure that the shared limit refuses (the source failed at other
    replicas too) bars the source here until that bucket refills.

    At most ``max_keys`` bars are kept: past it, those that have ended are forgotten, then the
    oldest (a forgotten source is barred again by its next failure: its bucket is still empty).
    """

    #: How a refusal names the caller.
    WHO = "failed authentications from this address"

    def __init__(self, limit: _Limit, clock: Clock = time.monotonic, max_keys: int = 100_000) -> None:
        self._limit, self._clock, self._max_keys = limit, clock, max_keys
        self._local: RateLimiter | None = limit if isinstance(limit, RateLimiter) else getattr(limit, "local", None)
        self._barred: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(self, source: str) -> None:
        """Raises :class:`RateLimited` while ``source`` may not fail again (nothing is spent)."""
        key = source_key(source)
        left = self._local.wait(key) if self._local is not None else 0.0
        until = self._barred.get(key)
        if until is not None:
            barred = until - self._clock()
            if barred > 0:
                left = max(left, barred)
            else:
                with self._lock:
                    if self._barred.get(key) == until:
                        del self._barred[key]
        if left > 0:
            raise RateLimited(left, who=self.WHO)

    def failed(self, source: str) -> None:
        """Count one failed authentication of ``source``; bar it if its bucket is empty."""
        key = source_key(source)
        try:
            self._limit.take(key, who=self.WHO)
        except RateLimited as exc:
            now = self._clock()
            with self._lock:
                self._barred.pop(key, None)  # re-inserted last: the oldest bars come first
                self._barred[key] = now + exc.retry_after
                if len(self._barred) > self._max_keys:
                    self._barred = {k: t for k, t in self._barred.items() if t > now}
                    while len(self._barred) > self._max_keys:
                        del self._barred[next(iter(self._barred))]
