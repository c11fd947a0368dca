"""The event log behind ``GET /v1/events``. The repository flushes, never commits."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from app.adapters.db.models import EventRow, utcnow

__all__ = ["EventRepository"]


class EventRepository:
    """Events in the order they were written (their ids)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def append(self, kind: str, subject: str, data: Mapping[str, Any], *, scope: str | None = None) -> None:
        self.session.add(EventRow(kind=kind, subject=subject[:200], scope=scope, data=dict(data), at=utcnow()))
        self.session.flush()

    def after(self, last_id: int, *, scopes: Collection[str] | None, limit: int = 500) -> list[dict[str, Any]]:
        query = select(EventRow).where(EventRow.id > last_id).order_by(EventRow.id).limit(limit)
        if scopes is not None:  # None: every event (an admin token)
            query = query.where(or_(EventRow.scope.is_(None), EventRow.scope.in_(list(scopes))))
        return [{"id": r.id, "at": r.at.isoformat(), "kind": r.kind, "subject": r.subject, "data": r.data}
                for r in self.session.scalars(query)]

    def last_id(self) -> int:
        found = self.session.scalar(select(EventRow.id).order_by(EventRow.id.desc()).limit(1))
        return int(found or 0)

    def prune(self, before: datetime) -> int:
        done = self.session.execute(delete(EventRow).where(EventRow.at < before))
        return int(getattr(done, "rowcount", 0) or 0)
