"""The audit log's hash chain on real SQLite and PostgreSQL: every writer links to the head, concurrent
writers never fork it, verify names the first entry altered or removed, the migration chains old entries."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, create_engine, inspect, pool, text
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.audit_seal import AuditSeal
from app.adapters.db import audit_chain
from app.adapters.db.audit import Auditor, attach, install
from app.adapters.db.audit_log import export_lines, verify_log
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import downgrade, upgrade
from app.adapters.db.models import Json, UtcDateTime
from app.adapters.db.repositories import AuditRepository
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.domain.audit_chain import ChainReport, entry_hash, verify
from app.services.auth import create_token
from app.settings import Settings


def fields(n: int | str, **extra: Any) -> dict[str, Any]:
    return {"request_id": f"r-{n}", "scopes": ["admin"], "source": "127.0.0.1", "action": "POST",
            "object": f"/v1/x/{n}", "outcome": 201, "detail": f"change {n}", **extra}


def check(factory: sessionmaker[Session]) -> ChainReport:
    with factory() as session, session.begin():
        return verify_log(session=session)


def write(factory: sessionmaker[Session], n: int) -> None:
    with factory() as session, session.begin():
        for i in range(n):
            AuditRepository(session).append(**fields(i))


def test_the_chain_is_intact_after_every_kind_of_write(session_factory: sessionmaker[Session]) -> None:
    install(session_factory)
    write(session_factory, 30)  # one transaction, many appends
    with session_factory() as session, session.begin():  # a batch in one statement
        AuditRepository(session).append_many([fields(f"b{i}") for i in range(25)])
    auditor = Auditor(session_factory, interval=3600)
    try:
        for i in range(10):
            auditor.write(fields(f"w{i}"))  # the hot path, its own transaction
            auditor.record(**fields(f"q{i}"))  # queued refusals
        assert auditor.flush() == 10
    finally:
        auditor.close()
    with session_factory() as session:  # a request's own record, at its commit
        pending = attach(session, lambda: fields("attached"))
        with session.begin():
            create_token(uow=SqlUnitOfWork(session), name="t", scopes=["admin"], expires_in=None, created_by="t",
                         audit=False)
        assert pending.committed is not None
    report = check(session_factory)
    assert report.intact, report.broken
    assert report.entries == 30 + 25 + 20 + 1


def test_a_rolled_back_append_leaves_the_chain_intact(session_factory: sessionmaker[Session]) -> None:
    write(session_factory, 3)
    with session_factory() as session:
        session.begin()
        AuditRepository(session).append(**fields("gone"))
        session.rollback()
    write(session_factory, 2)
    report = check(session_factory)
    assert report.intact
    assert report.entries == 5


def test_an_updated_detail_is_named(session_factory: sessionmaker[Session], engine: Engine) -> None:
    write(session_factory, 10)
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET detail = 'nothing to see' WHERE id = 6"))
    report = check(session_factory)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("altered", 6)


def test_a_deleted_middle_entry_names_the_next(session_factory: sessionmaker[Session], engine: Engine) -> None:
    write(session_factory, 10)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE id = 4"))
    report = check(session_factory)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("unlinked", 5)


def test_deleted_last_entries_are_found_and_later_appends_do_not_hide_it(
        session_factory: sessionmaker[Session], engine: Engine) -> None:
    write(session_factory, 10)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE id > 8"))
    report = check(session_factory)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("truncated", 10)
    write(session_factory, 1)  # the next entry still follows entry 10, and takes a new id
    report = check(session_factory)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.id) == ("unlinked", 11)


def test_a_second_entry_after_the_same_predecessor_is_refused(
        session_factory: sessionmaker[Session], engine: Engine) -> None:
    write(session_factory, 2)
    with engine.connect() as conn:
        first = conn.execute(text("SELECT prev_hash FROM audit_events WHERE id = 2")).scalar_one()
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(text(
                "INSERT INTO audit_events (id, at, request_id, scopes, source, action, object, outcome, detail, "
                "prev_hash, hash) VALUES (99, :at, 'fork', '[]', 's', 'POST', '/o', 200, '', :prev, :h)"),
                {"at": datetime.now(UTC).replace(tzinfo=None), "prev": first, "h": "f" * 64})


def test_concurrent_audited_changes_make_one_chain(session_factory: sessionmaker[Session]) -> None:
    """20 threads x 10 audited changes, through each writer the service has, all at once."""
    install(session_factory)
    auditor = Auditor(session_factory, interval=0.01)
    threads, per_thread = 20, 10
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                n = f"{t}-{i}"
                if i % 3 == 0:  # a request's change and its record, committed together
                    with session_factory() as session:
                        attach(session, lambda n=n: fields(n))  # type: ignore[misc]
                        with session.begin():
                            create_token(uow=SqlUnitOfWork(session), name=f"t{n}", scopes=["admin"], expires_in=None,
                                         created_by="t", audit=False)
                elif i % 3 == 1:  # a service's own record (the CLI's token create)
                    with session_factory() as session, session.begin():
                        create_token(uow=SqlUnitOfWork(session), name=f"t{n}", scopes=["admin"], expires_in=None,
                                     created_by="t")
                else:  # a change committed elsewhere, its record written before the answer; and a refusal
                    auditor.write(fields(n))
                    auditor.record(**fields(f"{n}-refused", outcome=403))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    auditor.close()
    assert not errors, errors[0]
    written = threads * (per_thread + 3)  # 10 changes and 3 refusals per thread
    report = check(session_factory)
    assert report.intact, report.broken
    assert report.entries == written
    with session_factory() as session:
        hashes = [e["prev_hash"] for e in audit_chain.entries(session)]
    assert len(set(hashes)) == written  # no entry has two successors


def test_export_round_trips(session_factory: sessionmaker[Session]) -> None:
    write(session_factory, 12)
    with session_factory() as session, session.begin():
        lines = list(export_lines(session=session))
        stored = list(audit_chain.entries(session))
        later = list(export_lines(session=session, since=9))
    parsed = [json.loads(line) for line in lines]
    assert [p["id"] for p in parsed] == list(range(1, 13))
    key = AuditSeal.from_settings(Settings()).read_key()  # the key outside the database, which a SIEM is given
    assert all(entry_hash(p, key) == p["hash"] for p in parsed)
    assert verify(parsed, key=key).intact
    for p, s in zip(parsed, stored, strict=True):
        assert datetime.fromisoformat(p.pop("at")) == s.pop("at")
        assert p == s
    assert [json.loads(line)["id"] for line in later] == [10, 11, 12]


_OLD_EVENTS = sa.table(
    "audit_events", sa.column("at", UtcDateTime()), sa.column("request_id", sa.String()),
    sa.column("client_request_id", sa.String()), sa.column("token_id", sa.String()),
    sa.column("token_name", sa.String()), sa.column("scopes", Json), sa.column("source", sa.String()),
    sa.column("action", sa.String()), sa.column("object", sa.String()), sa.column("outcome", sa.Integer()),
    sa.column("detail", sa.String()))


def test_upgrade_chains_existing_entries_and_downgrade_removes_the_chain(database_url: str) -> None:
    downgrade(database_url, "0009")
    plain = create_engine(database_url, poolclass=pool.NullPool)
    try:
        base = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
        with plain.begin() as conn:
            conn.execute(sa.insert(_OLD_EVENTS), [
                {**fields(i), "at": base + timedelta(seconds=i, microseconds=i), "client_request_id": None,
                 "token_id": None if i % 2 else "0123456789ab", "token_name": None, "detail": f"é {i}"}
                for i in range(2500)])  # more than one page of the data step
            conn.execute(text("DELETE FROM audit_events WHERE id = 7"))  # ids with a gap, as a rollback leaves
        upgrade(database_url)
        engine = make_engine(database_url)
        factory = make_session_factory(engine)
        try:
            report = check(factory)
            assert report.intact, report.broken
            assert (report.entries, report.last_id) == (2499, 2500)
            write(factory, 3)  # new entries follow the migrated ones
            assert check(factory).entries == 2502
        finally:
            engine.dispose()
        downgrade(database_url, "0009")
        assert "audit_chain_head" not in inspect(plain).get_table_names()
        assert {"prev_hash", "hash"}.isdisjoint(c["name"] for c in inspect(plain).get_columns("audit_events"))
        with plain.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM audit_events")).scalar_one() == 2502
        upgrade(database_url)  # and up again: the same entries, chained again
        # a chain made again (unkeyed) is a new chain: the old one's checkpoints are put aside
        (Settings().state_dir / "audit" / "checkpoints.jsonl").rename(Settings().state_dir / "old-checkpoints")
        engine = make_engine(database_url)
        try:
            assert check(make_session_factory(engine)).intact
        finally:
            engine.dispose()
    finally:
        plain.dispose()


def test_upgrade_of_an_empty_log_starts_the_chain(database_url: str) -> None:
    downgrade(database_url, "0009")
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        factory = make_session_factory(engine)
        assert check(factory).intact
        assert check(factory).entries == 0
        write(factory, 2)
        assert check(factory).entries == 2
    finally:
        engine.dispose()


def test_a_missing_head_is_reported_and_made_again_by_the_next_append(
        session_factory: sessionmaker[Session], engine: Engine) -> None:
    write(session_factory, 3)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_chain_head"))
    report = check(session_factory)
    assert report.broken is not None
    assert report.broken.kind == "head"
    write(session_factory, 1)
    report = check(session_factory)
    assert report.intact
    assert report.entries == 4
