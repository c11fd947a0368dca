"""The audit log: every change has its record before it is answered; refusals are batched.

- A change made in a request's own unit of work is recorded *in that transaction*
  (:func:`attach`, :func:`install`): the change and its record commit together or not at
  all, so a crash can never keep one without the other.
- A change made elsewhere (its own transaction in a service) is recorded by
  :meth:`Auditor.write` before the answer leaves, so every change a client saw succeed
  has its record even if the process is killed right after.
- What changes nothing (refusals, negotiations) must not pay a database write of its own:
  :meth:`Auditor.record` queues it and a background thread writes the queue every
  ``interval`` seconds (or at once by :meth:`Auditor.flush`, which the audit read endpoint
  calls; :meth:`Auditor.close`, called on shutdown, writes what is left).
- Repeated refusals of one kind from one source are one entry per window, not one each
  (:meth:`Auditor.refused`, :mod:`app.adapters.db.refusals`): a flood of bad tokens cannot
  grow the log, or bury what else it holds, at the rate it is sent.

Records never hold key material: no request bodies, only who, what object, outcome.

Given the audit seal (:class:`~app.adapters.audit_seal.AuditSeal`), the :class:`Auditor` checks
the audit key against the chain when it is made (a keyed chain without its key refuses to
start) and writes a checkpoint of the chain's end when it is closed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.audit_seal import AuditSeal
from app.adapters.db import audit_chain
from app.adapters.db.hot import engine_of, hot_transaction
from app.adapters.db.models import utcnow
from app.adapters.db.refusals import RefusalDigest
from app.adapters.db.repositories import AuditRepository
from app.domain.audit_chain import Checkpoint

__all__ = ["Auditor", "PendingRecord", "attach", "install", "take"]

_INFO_KEY = "qoss.audit"

class PendingRecord:
    """One request's audit record, written by the request's own transaction when it commits.

    ``fields`` is called at commit time (the outcome and detail are known by then). After a
    commit, :attr:`committed` holds what was written; a rolled-back commit leaves it None.
    """

    def __init__(self, fields: Callable[[], dict[str, Any]]) -> None:
        self._fields = fields
        self._staged: dict[str, Any] | None = None
        self.committed: dict[str, Any] | None = None

    def fields(self) -> dict[str, Any]:
        """The record as it stands now (``at`` now unless the request set it), to be written by
        whoever took it from its session (:func:`take`); :attr:`committed` is theirs to set."""
        fields = self._fields()
        fields.setdefault("at", utcnow())
        return fields


def attach(session: Session, fields: Callable[[], dict[str, Any]]) -> PendingRecord:
    """Have ``session``'s first successful commit write the record ``fields()`` describes
    (the session must come from a factory passed to :func:`install`)."""
    pending = PendingRecord(fields)
    session.info[_INFO_KEY] = pending
    return pending


def take(session: Session) -> PendingRecord | None:
    """The record ``session`` carries (:func:`attach`), no longer written by its commit: the
    caller writes it in a transaction of its own choosing and sets its ``committed``."""
    pending: PendingRecord | None = session.info.pop(_INFO_KEY, None)
    return pending


def _before_commit(session: Session) -> None:
    # SQLAlchemy also calls this when a savepoint is released: the record is built at the
    # outermost commit only, when the request has said all it will (its outcome, its detail).
    if session.in_nested_transaction():
        return
    pending: PendingRecord | None = session.info.get(_INFO_KEY)
    if pending is not None and pending.committed is None and pending._staged is None:
        fields = pending.fields()
        AuditRepository(session).append(**fields)
        pending._staged = fields


def _after_commit(session: Session) -> None:
    pending: PendingRecord | None = session.info.get(_INFO_KEY)
    if pending is not None and pending._staged is not None:
        pending.committed, pending._staged = pending._staged, None


def _after_rollback(session: Session) -> None:
    pending: PendingRecord | None = session.info.get(_INFO_KEY)
    if pending is not None:
        pending._staged = None  # the insert went with the rollback


def install(factory: sessionmaker[Session]) -> None:
    """Let sessions of ``factory`` carry a :class:`PendingRecord` (see :func:`attach`)."""
    if not event.contains(factory, "before_commit", _before_commit):
        event.listen(factory, "before_commit", _before_commit)
        event.listen(factory, "after_commit", _after_commit)
        event.listen(factory, "after_rollback", _after_rollback)

log = logging.getLogger("qoss.audit")


class Auditor:
    """Batches audit records into the database.

    Args:
        interval: seconds between writes of the queue.
        refusal_window: seconds over which repeated refusals of one kind are counted into one
            entry (see :meth:`refused`).
        refusal_kinds: kinds of refusal counted at once (each holds one record).
        seal: the service's audit key and checkpoints (None: the environment's, found at the
            first write, and no checkpoint at close). Given, the key is checked against the
            chain here (blocking: call it off the event loop).

    Raises:
        AuditKeyError: the chain is keyed and the seal has no key for it, or another key.
    """

    def __init__(self, session_factory: Callable[[], Session], interval: float = 0.1, *,
                 refusal_window: float = 60.0, refusal_kinds: int = 10_000, seal: AuditSeal | None = None) -> None:
        self._factory = session_factory
        self._engine: Engine | None = None
        self._interval = interval
        self._writer: audit_chain.ChainWriter | None = None
        if seal is not None:  # a keyed chain without its key refuses to start
            self._engine = engine_of(session_factory)
            self._writer = audit_chain.seal_engine(self._engine, seal)
            with session_factory() as session, session.begin():
                self._writer.open_in(session)
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._refusals = RefusalDigest(self._queue.put, window=refusal_window, max_keys=refusal_kinds)
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qoss-audit", daemon=True)
        self._thread.start()

    def record(self, **fields: Any) -> None:
        """Queue one record (never blocks the request); it is stamped now, not when written."""
        fields.setdefault("at", utcnow())
        self._queue.put(fields)

    def refused(self, fields: dict[str, Any], *, route: str) -> None:
        """Queue a refusal's record, or count it if one of its kind (source, outcome, method,
        ``route``, token) was recorded within the window: the window's count is recorded as one
        entry when it closes (:mod:`app.adapters.db.refusals`). Never blocks."""
        fields.setdefault("at", utcnow())
        self._refusals.refused(fields, route=route)

    def write(self, fields: dict[str, Any]) -> None:
        """Write one record now, in its own transaction (blocking: call it off the event loop).

        For a change already committed elsewhere, before it is answered. If the database
        refuses, the record is queued for the writer's next attempt (and the failure logged).
        """
        fields.setdefault("at", utcnow())
        due: list[Checkpoint] = []
        try:
            if self._engine is None:
                self._engine = engine_of(self._factory)
            writer = audit_chain.writer_of(self._engine)
            with hot_transaction(self._engine) as cursor:  # no ORM: this write is on an answer's path
                audit_chain.append(cursor, [fields], writer=writer, due=due)
        except Exception:
            if due:
                writer.dropped()
            log.exception("audit write failed; the record is kept for retry")
            self._queue.put(fields)
            return
        for checkpoint in due:  # committed: now outside the database too
            writer.write(checkpoint)

    def flush(self) -> int:
        """Write everything queued now, with the summaries of the refusal windows that have
        closed; returns how many records were written."""
        self._refusals.close_due()
        with self._write_lock:
            batch: list[dict[str, Any]] = []
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not batch:
                return 0
            try:
                with self._factory() as session, session.begin():
                    AuditRepository(session).append_many(batch)
            except Exception:
                # Keep the records for the next attempt (database briefly unavailable).
                for fields in batch:
                    self._queue.put(fields)
                log.exception("audit write failed; %d records kept for retry", len(batch))
                return 0
            return len(batch)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        """Stop the writer after a last flush (every refusal window's summary included); with a
        seal, write a checkpoint of the chain's end."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._refusals.close_all()
        self.flush()
        if self._writer is not None:  # the chain's end, outside the database
            try:
                with self._factory() as session, session.begin():
                    audit_chain.checkpoint_end(session, self._writer)
            except Exception:
                log.exception("the audit checkpoint at shutdown could not be written")
