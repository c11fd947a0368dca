"""How long something that failed waits before it is tried again: twice as long each time, up to a bound."""

from __future__ import annotations

__all__ = ["doubling_delay"]


def doubling_delay(attempts: int, *, first: float, most: float) -> float:
    """Seconds until the next attempt after ``attempts`` failed ones (at least one): ``first``
    after one, twice as long after each more, never more than ``most``."""
    return min(first * 2.0 ** min(max(attempts - 1, 0), 16), most)
