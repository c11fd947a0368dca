"""The audit chain's checkpoints from a real writer: when keying starts, every N entries and at
shutdown; a keyed chain without its key refuses to start."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.audit_seal import AuditKeyError, AuditSeal
from app.adapters.db.audit import Auditor
from app.adapters.db.audit_log import verify_log
from app.adapters.db.repositories import AuditRepository
from app.adapters.state_dir import StateDir


def fields(n: int) -> dict[str, object]:
    return {"request_id": f"r-{n}", "scopes": ["admin"], "source": "127.0.0.1", "action": "POST",
            "object": f"/v1/x/{n}", "outcome": 201, "detail": ""}


def test_checkpoints_when_keying_starts_every_n_and_at_shutdown(
        session_factory: sessionmaker[Session], tmp_path: Path) -> None:
    seal = AuditSeal(StateDir(tmp_path / "var"), checkpoint_every=10)
    auditor = Auditor(session_factory, interval=3600, seal=seal)
    try:
        for i in range(12):
            auditor.write(fields(i))
        with session_factory() as session, session.begin():  # one transaction passing entry 20
            AuditRepository(session).append_many([fields(i) for i in range(12, 25)])
        with session_factory() as session:
            session.begin()
            AuditRepository(session).append_many([fields(i) for i in range(25, 40)])  # past 30, rolled back
            session.rollback()
    finally:
        auditor.close()
    key = seal.read_key()
    assert key is not None
    # keying starts at 1; 10; the batch passing 20 ends at 25, which the shutdown's would repeat; none
    # of the rolled-back entries
    assert [c.last_id for c in seal.read_checkpoints(key)] == [1, 10, 25]
    with session_factory() as session, session.begin():
        report = verify_log(session=session, seal=seal)
    assert report.intact, report.broken
    assert (report.entries, report.keyed_from, report.checkpoints) == (25, 1, 3)
    auditor = Auditor(session_factory, interval=3600, seal=seal)
    auditor.write(fields(25))
    auditor.close()
    with session_factory() as session, session.begin():
        report = verify_log(session=session, seal=seal)
    assert report.intact, report.broken
    assert seal.read_checkpoints(key)[-1].last_id == report.last_id  # at shutdown (26; PostgreSQL: after 40)
    assert report.checkpoints == 4


def test_a_keyed_chain_without_its_key_refuses_to_start(
        session_factory: sessionmaker[Session], tmp_path: Path) -> None:
    auditor = Auditor(session_factory, interval=3600, seal=AuditSeal(StateDir(tmp_path / "a")))
    auditor.write(fields(1))
    auditor.close()
    with pytest.raises(AuditKeyError, match="no audit key"):
        Auditor(session_factory, interval=3600, seal=AuditSeal(StateDir(tmp_path / "b")))
    assert not (tmp_path / "b" / "audit" / "chain.key").exists()
