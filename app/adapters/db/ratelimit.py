"""Rate limits shared by every replica on one PostgreSQL database.

A limit's token bucket is a row of ``rate_buckets``, spent and refilled by one statement
(``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``) on the database's own clock, so replicas
whose clocks differ still agree, and a client gets the configured rate whichever replica it
reaches, not that rate times the number of replicas.

In front of it each process keeps the same limit in memory
(:class:`app.domain.ratelimit.RateLimiter`): a request that limit refuses never reaches the
database, so a flood from one address costs the database nothing past the first burst. If
the database cannot be asked (it is away, or too slow) the request is judged by the
in-memory limit alone: a limit must not turn a database hiccup into refused clients.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from app.domain.ratelimit import RateLimited, RateLimiter

__all__ = ["SharedRateLimiter", "shared_buckets_engine"]

log = logging.getLogger("qoss.ratelimit")

_NOW = "clock_timestamp()"
#: The bucket refilled since its last request: min(burst, tokens + seconds since then x rate).
_REFILL = f"LEAST(:burst, b.tokens + EXTRACT(EPOCH FROM {_NOW} - b.at) * :rate)"
_LEFT = f"({_REFILL} - CASE WHEN {_REFILL} >= 1 THEN 1 ELSE 0 END)"
#: Spend one request if the refilled bucket holds one; either way say which it was.
_SPEND = text(f"""
INSERT INTO rate_buckets AS b (key, tokens, at, full_at, spent)
VALUES (:key, :burst - 1, {_NOW}, {_NOW} + make_interval(secs => 1 / :rate), true)
ON CONFLICT (key) DO UPDATE SET
    tokens = {_LEFT},
    at = {_NOW},
    full_at = {_NOW} + make_interval(secs => (:burst - {_LEFT}) / :rate),
    spent = {_REFILL} >= 1
RETURNING tokens, spent
""")  # noqa: S608 (no value is formatted in: the pieces are constants above)
_PRUNE = text(f"DELETE FROM rate_buckets WHERE full_at < {_NOW}")  # noqa: S608


def shared_buckets_engine(database_url: str, timeout: float = 0.5) -> Engine:
    """A small pool of its own for the buckets, with a short statement timeout: a slow database
    costs a request at most ``timeout`` seconds before the in-memory limit decides alone."""
    ms = max(1, int(timeout * 1000))
    return create_engine(database_url, pool_size=4, max_overflow=8, pool_timeout=timeout,
                         isolation_level="AUTOCOMMIT",
                         connect_args={"connect_timeout": 2, "options": f"-c statement_timeout={ms}"})


class SharedRateLimiter:
    """``rate`` requests per second on average, bursts of up to ``burst``, per key, counted
    across every replica sharing ``engine``'s database (see the module's docstring).

    Args:
        engine: from :func:`shared_buckets_engine`.
        name: the limit's name, part of each bucket's key (two limits never share a bucket).
        prune_every: spends between removals of buckets that are full again.
    """

    def __init__(self, engine: Engine, name: str, rate: float, burst: int, *, prune_every: int = 10_000) -> None:
        self._engine, self._name, self._rate, self._burst = engine, name, float(rate), float(burst)
        self.local = RateLimiter(rate, burst)
        self._prune_every = prune_every
        self._since_prune = 0
        self._lock = threading.Lock()
        self._quiet_until = 0.0  # after a failure, the database is not asked for a moment

    def take(self, key: str, *, who: str = "this token") -> None:
        """Spend one request for ``key``; raises :class:`RateLimited` when its bucket is empty."""
        self.local.take(key, who=who)
        if time.monotonic() < self._quiet_until:
            return
        try:
            with self._engine.connect() as conn:
                tokens, spent = conn.execute(_SPEND, {"key": f"{self._name}:{key}"[:200], "burst": self._burst,
                                                      "rate": self._rate}).one()
                if self._due():
                    conn.execute(_PRUNE)
        except SQLAlchemyError as exc:
            self._quiet_until = time.monotonic() + 1.0
            cause = getattr(exc, "orig", None) or exc
            log.warning("shared rate limit %s not asked (%s): the in-memory limit decides", self._name,
                        type(cause).__name__)
            return
        if not spent:
            raise RateLimited((1 - tokens) / self._rate, who=who)

    def _due(self) -> bool:
        with self._lock:
            self._since_prune += 1
            if self._since_prune >= self._prune_every:
                self._since_prune = 0
                return True
        return False
