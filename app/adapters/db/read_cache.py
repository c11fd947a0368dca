"""What a process may read once and trust for a moment: rows every request reads (the
registered gateways, the API tokens), shared by the process's sessions through their
factory's ``info``.

A value read from the database is trusted for ``ttl`` seconds; this process's own changes
forget it at once; a change another replica (or ``qoss`` on the same database) makes is seen
within ``ttl``. With ``ttl`` 0 nothing is kept and every read asks the database (a cache that
checks a value past its TTL against the database, as the rating tables' does, keeps it still).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import ClassVar, Generic, TypeVar

__all__ = ["ReadCache"]

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class ReadCache(Generic[_K, _V]):
    """Values by key, each trusted for ``ttl`` seconds after it was read; at most ``max_entries``
    (past it, the oldest read is dropped first)."""

    #: A value past its TTL is checked against the database (and kept if unchanged), not read
    #: again: so it is kept with ``ttl`` 0 too.
    checked: ClassVar[bool] = False

    def __init__(self, ttl: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self._clock = clock
        self._max = max_entries
        self._lock = threading.Lock()
        self._values: dict[_K, tuple[_V, float]] = {}

    def fresh(self, key: _K) -> _V | None:
        """The value if it was read less than ``ttl`` seconds ago."""
        found = self._values.get(key)  # one dict read: atomic, no lock needed to look
        return found[0] if found is not None and self._clock() - found[1] < self.ttl else None

    def last(self, key: _K) -> _V | None:
        """The value however long ago it was read (None: never read, or forgotten since)."""
        found = self._values.get(key)
        return found[0] if found is not None else None

    def keep(self, key: _K, value: _V) -> None:
        """Remember ``value``, just read from the database (nothing with ``ttl`` 0 unless
        :attr:`checked`)."""
        if self.ttl <= 0 and not self.checked:
            return
        with self._lock:
            self._values.pop(key, None)
            if len(self._values) >= self._max:
                del self._values[next(iter(self._values))]
            self._values[key] = (value, self._clock())

    def forget(self, key: _K) -> None:
        """This process changed it: the next read asks the database."""
        with self._lock:
            self._values.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
