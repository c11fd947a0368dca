"""A change's audit record is built when the request's transaction commits, not at a savepoint
inside it: what the request says after a savepoint (its detail, its outcome) is in the record."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.audit import attach, install
from app.adapters.db.models import AuditRow


def test_the_record_is_built_at_the_outermost_commit(session_factory: sessionmaker[Session]) -> None:
    install(session_factory)
    said: dict[str, Any] = {"request_id": "r-1", "source": "127.0.0.1", "action": "POST", "scopes": [],
                            "object": "/v1/x", "outcome": 0, "detail": "before"}
    with session_factory() as session:
        pending = attach(session, lambda: dict(said))
        with session.begin():
            with session.begin_nested():  # a repository's savepoint
                pass
            said.update(outcome=200, detail="after the savepoint")
        assert pending.committed is not None
    with session_factory() as session:
        (row,) = session.scalars(select(AuditRow).where(AuditRow.request_id == "r-1")).all()
        assert (row.outcome, row.detail) == (200, "after the savepoint")
