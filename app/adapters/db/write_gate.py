"""One SQLite writer at a time in this process, waiting in a queue instead of on SQLite's lock.

SQLite lets one write transaction run at a time. A writer that finds the database locked
does not wait on the lock itself: its busy handler sleeps and tries again, sleeping longer
each time (1, 2, 5, 10 … up to 100 ms). Under a few concurrent writers most of their time
goes to those sleeps while the lock stands free. A :class:`WriteGate` per database file
lets this process's writers wait on a ``threading.Lock`` instead: the next writer starts
the moment the last one ends. SQLite's own lock still guards the file against other
processes (a CLI command beside the server), whose writers meet the busy handler as before.

The gate is taken when a write transaction begins (``BEGIN IMMEDIATE``, see
:func:`app.adapters.db.engine.make_engine`) and given back when its connection goes back to
the pool (a Session does that as its transaction ends; :mod:`app.adapters.db.hot` gives it
back at its commit or rollback). A writer that cannot have the gate
within the busy timeout goes on to SQLite's lock without it, so nothing waits longer than
it did without the gate.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import MutableMapping
from typing import Any

from sqlalchemy import Engine, event

__all__ = ["WriteGate", "gate_of", "gates", "install"]

#: Where a connection's (pool record's) info says it holds the gate, and since when.
_HELD = "qoss.write_gate"
_SINCE = "qoss.write_gate.since"

_gates: dict[str, WriteGate] = {}
_gates_lock = threading.Lock()
_by_engine: weakref.WeakKeyDictionary[Engine, WriteGate] = weakref.WeakKeyDictionary()


class WriteGate:
    """The queue of one database file's writers in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: How many writers took the gate, and how many went on without it (timed out).
        self.entered = 0
        self.bypassed = 0
        #: Seconds writers waited for the gate, and seconds it was held (each write
        #: transaction's, from its BEGIN to its end): ``busy`` over a span of time is the
        #: share of it this process's SQLite writes took, one after the other.
        self.waited = 0.0
        self.busy = 0.0

    def enter(self, info: MutableMapping[str, Any], timeout: float) -> None:
        """Wait for the gate (at most ``timeout`` seconds) for the connection whose ``info`` this is."""
        if info.get(_HELD) is self:
            return  # this connection's transaction holds it already
        asked = time.perf_counter()
        if self._lock.acquire(timeout=timeout):
            now = time.perf_counter()
            info[_HELD], info[_SINCE] = self, now
            self.entered += 1
            self.waited += now - asked
        else:
            self.bypassed += 1
            self.waited += time.perf_counter() - asked

    def leave(self, info: MutableMapping[str, Any]) -> None:
        """Give the gate back if that connection holds it (a second call does nothing)."""
        if info.get(_HELD) is self:
            del info[_HELD]
            self.busy += time.perf_counter() - info.pop(_SINCE)
            self._lock.release()

    def held(self) -> bool:
        """Whether some writer of this process holds the gate now."""
        return self._lock.locked()


def install(engine: Engine, database: str, timeout: float) -> WriteGate:
    """Queue ``engine``'s write transactions behind the gate of the file ``database`` (shared
    by every engine of this process on that file); the engine must open its transactions with
    ``BEGIN IMMEDIATE`` from its ``begin`` event, after this is installed."""
    with _gates_lock:
        gate = _gates.setdefault(os.path.realpath(database), WriteGate())
    _by_engine[engine] = gate

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        gate.enter(conn.info, timeout)

    # Not the engine's ``commit`` and ``rollback`` events: a listener of those takes statements
    # off the hot path (app.adapters.db.hot). A Session gives its connection back to the pool
    # when its transaction ends, and the hot path gives the gate back itself.
    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        gate.leave(record.info)

    return gate


def gates() -> dict[str, WriteGate]:
    """This process's gates, by database file."""
    with _gates_lock:
        return dict(_gates)


def gate_of(engine: Engine) -> WriteGate | None:
    """The gate of ``engine``'s writers, or None (PostgreSQL, a read-only or in-memory engine)."""
    return _by_engine.get(engine)
