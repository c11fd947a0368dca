"""Short writes committed together: one SQLite transaction for the writes that wait at once.

On SQLite one write transaction runs at a time (:mod:`app.adapters.db.write_gate`). Under many
concurrent tunnel set-ups each set-up's record had a transaction of its own (BEGIN, the
inputs read again, the record, its event, its audit entry and the chain's head, COMMIT), and
the others waited for it. :class:`WriteGroups` combines them: the first writer that finds no
group being written leads one; it takes the writes queued behind it (at most ``limit``), runs
each on its own unit of work, writes their audit records in one append to the chain, and
commits once. Each writer then gets its own result or error. Writers that arrive while a group
is being written queue for the next group, which the first of them leads.

A piece of work given to :meth:`WriteGroups.run`:

* runs in the leader's thread, on the leader's unit of work, inside the group's transaction;
* may run more than once. When one piece raises, the group's transaction is rolled back and
  the others run again without it, so that a failed piece leaves nothing of its own behind and
  takes nothing of anyone else's with it. A failure of the group's own statements or of its
  commit is every piece's error;
* must read and write only through the unit it is given, and do nothing it could not repeat.

The request's audit record (:func:`app.adapters.db.audit.attach`) goes with its piece of work:
written in the group's transaction, right after the pieces, and marked committed when the group
is. PostgreSQL, where the replicas' writers run side by side, does not group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.adapters.db.audit import PendingRecord
from app.domain.ports import UnitOfWork

__all__ = ["WriteGroups"]

log = logging.getLogger("qoss.db")

_T = TypeVar("_T")
_U = TypeVar("_U", bound=UnitOfWork)


@dataclass(eq=False)
class _Write:
    """One writer's piece of work, and what came of it."""

    work: Callable[[Any], Any]
    audit: PendingRecord | None
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to lead the next group (not yet written)
    result: Any = None
    error: BaseException | None = None


class WriteGroups:
    """Writers of one database in this process, combined into groups (see the module's docstring).

    Attributes:
        groups: how many groups were committed or failed; ``writes``: how many pieces of work
            they held (``writes / groups`` is the mean group); ``waited``: the seconds writers
            waited in line for a group (until it was written, or until they led one).
    """

    def __init__(self, *, limit: int = 32) -> None:
        if limit < 1:
            raise ValueError("a group holds at least one write")
        self.limit = limit
        self._lock = threading.Lock()
        self._queue: deque[_Write] = deque()
        self._busy = False
        self.groups = 0
        self.writes = 0
        self.waited = 0.0

    def waiting(self) -> int:
        """How many writers wait for the next group."""
        with self._lock:
            return len(self._queue)

    def run(self, unit: _U, work: Callable[[_U], _T], audit: PendingRecord | None) -> _T:
        """``work`` committed in a group, with ``audit`` (taken from ``unit``'s session) written
        beside it; its result, or its error (or the group's). ``unit`` must hold nothing
        uncommitted: if this writer leads, the group is written on it."""
        mine = _Write(work, audit)
        with self._lock:
            lead = not self._busy
            if lead:
                self._busy = True
            else:
                self._queue.append(mine)
        if not lead:
            asked = time.perf_counter()
            mine.done.wait()
            lead = mine.lead
            waited = time.perf_counter() - asked
            with self._lock:
                self.waited += waited
        if lead:
            self._lead(unit, mine)
        if mine.error is not None:
            raise mine.error
        result: _T = mine.result
        return result

    def _lead(self, unit: UnitOfWork, mine: _Write) -> None:
        with self._lock:
            group = [mine] + [self._queue.popleft() for _ in range(min(len(self._queue), self.limit - 1))]
        try:
            self._write(unit, group)
        finally:
            with self._lock:
                following = self._queue.popleft() if self._queue else None
                if following is None:
                    self._busy = False
                self.groups += 1
                self.writes += len(group)
            for write in group[1:]:
                write.done.set()
            if following is not None:  # the first who came meanwhile leads the next group
                following.lead = True
                following.done.set()

    @staticmethod
    def _write(unit: UnitOfWork, group: list[_Write]) -> None:
        """Every piece of ``group`` in one transaction of ``unit``, with its audit record; a piece
        that raises is left out and the rest run again in a new transaction."""
        left = group
        while left:
            failed: _Write | None = None
            try:
                for write in left:
                    failed = write
                    write.result = write.work(unit)
                failed = None
                staged = [(write, write.audit.fields()) for write in left if write.audit is not None]
                if staged:
                    unit.audit.append_many([fields for _, fields in staged])
                unit.commit()
            except BaseException as exc:
                _rolled_back(unit)
                if failed is None or not isinstance(exc, Exception):  # the group's own failure
                    for write in left:
                        write.result, write.error = None, exc
                    return
                failed.error = exc
                left = [write for write in left if write is not failed]
                for write in left:
                    write.result = None
                continue
            for write, fields in staged:
                assert write.audit is not None
                write.audit.committed = fields
            return


def _rolled_back(unit: UnitOfWork) -> None:
    try:
        unit.rollback()
    except Exception as exc:  # the connection is gone: the error each writer gets says why
        log.warning("a write group's rollback failed: %s", type(exc).__name__)
