"""The event log behind ``GET /v1/events``. The repository never commits.

Ids are the order a follower reads events in (``after(last_id)``), so an event must never get
an id below one a follower may already have read. On PostgreSQL two transactions take ids
from the sequence in one order and may commit in the other: a follower that read id 11 would
never see 10 committed after it. So an event is not inserted when it is appended: it waits in
its session and is inserted just before the commit, under the lock the audit chain takes
(:func:`app.adapters.db.audit_chain.lock_in`, held to the commit), which every other writer of
events (the audit chain's own) holds too. Ids are therefore taken in commit order, and what a
reader sees of the log is always everything up to some id. Reading in the same transaction
inserts what is waiting first (a transaction sees its own events).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, event, or_, select
from sqlalchemy.orm import Session, SessionTransaction

from app.adapters.db import audit_chain
from app.adapters.db.hot import session_cursor
from app.adapters.db.models import EventRow, utcnow

__all__ = ["EventRepository", "write_waiting"]

_WAITING = "qoss.events.waiting"


class EventRepository:
    """Events in the order they were committed (their ids)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def append(self, kind: str, subject: str, data: Mapping[str, Any], *, scope: str | None = None) -> None:
        if not self.session.in_transaction():
            self.session.begin()  # so that a rollback, even before any statement, drops the event
        self.session.info.setdefault(_WAITING, []).append(
            {"kind": kind, "subject": subject[:200], "scope": scope, "data": dict(data), "at": utcnow()})

    def after(self, last_id: int, *, scopes: Collection[str] | None, limit: int = 500,
              kinds: Collection[str] | None = None) -> list[dict[str, Any]]:
        write_waiting(self.session)
        query = select(EventRow).where(EventRow.id > last_id).order_by(EventRow.id).limit(limit)
        if kinds is not None:
            query = query.where(EventRow.kind.in_(sorted(kinds)))
        if scopes is not None:  # None: every event (an admin token)
            query = query.where(or_(EventRow.scope.is_(None), EventRow.scope.in_(list(scopes))))
        return [{"id": r.id, "at": r.at.isoformat(), "kind": r.kind, "subject": r.subject, "data": r.data}
                for r in self.session.scalars(query)]

    def last_id(self) -> int:
        write_waiting(self.session)
        found = self.session.scalar(select(EventRow.id).order_by(EventRow.id.desc()).limit(1))
        return int(found or 0)

    def prune(self, before: datetime) -> int:
        done = self.session.execute(delete(EventRow).where(EventRow.at < before))
        return int(getattr(done, "rowcount", 0) or 0)


def write_waiting(session: Session) -> None:
    """Insert the events appended in ``session`` and not yet written, under the chain's lock."""
    waiting = session.info.pop(_WAITING, None)
    if waiting:
        audit_chain.lock_in(session)
        with session_cursor(session) as cursor:  # one statement, compiled once (app.adapters.db.hot)
            cursor.execute_many(audit_chain.INSERT_EVENT, waiting)


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    if not session.in_nested_transaction():
        write_waiting(session)


@event.listens_for(Session, "after_soft_rollback")
def _after_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    if not previous_transaction.nested:
        session.info.pop(_WAITING, None)  # they went with their transaction
