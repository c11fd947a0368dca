"""Rate limits (token bucket): 429 with Retry-After when exceeded.

Keyed by API token, for anonymous negotiations by client address and in total, and for
the tunnel agent (whose requests carry no token) by source address and by verified user.

:class:`RateLimiter` keeps its buckets in the process: the one process of a SQLite
database. Replicas sharing a PostgreSQL database count in the database as well
(:class:`app.adapters.db.ratelimit.SharedRateLimiter`), so a client gets the configured
rate whichever replica it reaches.
"""

from __future__ import annotations

import math
import threading
import time

from app.domain.errors import QossError
from app.domain.ports import Clock

__all__ = ["Overloaded", "RateLimited", "RateLimiter"]


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
