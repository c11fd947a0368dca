"""The audit writer: records are stamped when made, written in one batch, kept when a write fails."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.audit import Auditor
from app.adapters.db.repositories import AuditRepository


def _record(auditor: Auditor, request_id: str, **extra: object) -> None:
    auditor.record(request_id=request_id, scopes=[], source="127.0.0.1", action="POST", object="/v1/x",
                   outcome=200, **extra)


def test_records_keep_the_time_they_were_made_and_are_written_in_one_batch(
    session_factory: sessionmaker[Session],
) -> None:
    auditor = Auditor(session_factory, interval=3600)  # only explicit flushes
    try:
        _record(auditor, "first", token_id="tok-1", token_name="ci", detail="made first")
        time.sleep(0.05)
        _record(auditor, "second")  # no token, no detail: the columns' defaults
        assert auditor.flush() == 2
        assert auditor.flush() == 0
    finally:
        auditor.close()
    with session_factory() as session:
        second, first = AuditRepository(session).list()
    assert (first["request_id"], first["token_id"], first["token_name"], first["detail"]) == (
        "first", "tok-1", "ci", "made first")
    assert (second["request_id"], second["token_id"], second["token_name"], second["detail"]) == (
        "second", None, None, "")
    # each record carries the time it was made, not the time of the (one) write
    gap = datetime.fromisoformat(second["at"]) - datetime.fromisoformat(first["at"])
    assert gap >= timedelta(seconds=0.04)


def test_a_failed_write_keeps_the_records_for_the_next_flush(
    session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    auditor = Auditor(session_factory, interval=3600)
    try:
        _record(auditor, "kept")
        calls = []

        def failing(self: AuditRepository, records: object) -> None:
            calls.append(records)
            raise RuntimeError("database briefly unavailable")

        with monkeypatch.context() as m:
            m.setattr(AuditRepository, "append_many", failing)
            assert auditor.flush() == 0
        assert len(calls) == 1
        assert auditor.flush() == 1
    finally:
        auditor.close()
    with session_factory() as session:
        (row,) = AuditRepository(session).list()
    assert row["request_id"] == "kept"
