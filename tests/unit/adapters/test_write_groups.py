"""Writers committed in groups (SQLite): one transaction for the writes that wait at once, each
with its audit record and events; a failed write leaves nothing and takes nobody else's with it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db import audit_chain
from app.adapters.db.audit import PendingRecord, attach, install
from app.adapters.db.models import AuditRow, EventRow, TunnelRow
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.adapters.db.write_groups import WriteGroups
from app.domain import audit_chain as chain
from app.domain.errors import AlreadyExists, Conflict
from app.domain.tunnels import TunnelRecord, TunnelState
from tests.contract.databases import migrated_sessions

Work = Callable[[SqlUnitOfWork], str]


@pytest.fixture(params=["fast", "public"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """A migrated SQLite database whose sessions carry audit records (as the server's do), its
    statements on the hot path or on SQLAlchemy's public one."""
    with migrated_sessions("sqlite", tmp_path, fast_paths=request.param == "fast") as factory:
        install(factory)
        yield factory


def _record(tunnel_id: str) -> TunnelRecord:
    return TunnelRecord(id=tunnel_id, initiator="left", responder="right", local_ts=("10.1.0.0/24",),
                        remote_ts=("10.2.0.0/24",), state=TunnelState.UP, negotiation={"suite": {}})


def _adding(tunnel_id: str, *, then: Callable[[], None] = lambda: None) -> Work:
    """A set-up's write: the record and its event (``then`` runs after both)."""

    def work(unit: SqlUnitOfWork) -> str:
        unit.tunnels.add(_record(tunnel_id), keep_transaction=False)
        unit.events.append("tunnel.created", tunnel_id, {"state": "up"})
        then()
        return tunnel_id

    return work


def _writer(sessions: sessionmaker[Session], name: str, groups: WriteGroups) -> tuple[SqlUnitOfWork, PendingRecord]:
    """A request's unit of work (as the server makes it), carrying its audit record."""
    session = sessions()
    pending = attach(session, lambda: {"action": "POST", "object": f"/v1/tunnels/{name}", "outcome": 201,
                                       "source": "127.0.0.1", "scopes": ["tunnels:write"], "request_id": f"r-{name}"})
    return SqlUnitOfWork(session, groups=groups), pending


def _write(groups: WriteGroups, sessions: sessionmaker[Session], name: str, work: Work,
           out: dict[str, Any]) -> None:
    unit, pending = _writer(sessions, name, groups)
    try:
        out[name] = unit.commit_with(work)
    except Exception as exc:  # the test reads each writer's outcome
        out[name] = exc
    finally:
        out[f"{name}.audit"] = pending.committed
        unit.session.close()


def _joined(threads: list[threading.Thread], seconds: float) -> None:
    """Every thread ended within ``seconds`` (all together): no writer was left waiting."""
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a writer still waits"


def _stored(sessions: sessionmaker[Session]) -> tuple[set[str], list[str], list[str]]:
    """The tunnels, the tunnel events' subjects and the audit records' objects in the database;
    the audit chain checked whole."""
    with sessions() as s:
        tunnels = set(s.scalars(select(TunnelRow.id)))
        events = list(s.scalars(select(EventRow.subject).where(EventRow.kind == "tunnel.created")
                                .order_by(EventRow.id)))
        audited = list(s.scalars(select(AuditRow.object).order_by(AuditRow.id)))
        audit_events = s.scalar(select(func.count()).select_from(EventRow).where(EventRow.kind == "audit"))
        report = chain.verify(audit_chain.entries(s), head=audit_chain.head(s),
                              key=audit_chain.writer_of(s.get_bind()).key)
    assert report.broken is None
    assert report.entries == len(audited) == audit_events
    return tunnels, events, audited


def _held_open(groups: WriteGroups, sessions: sessionmaker[Session], followers: list[tuple[str, Work]],
               out: dict[str, Any]) -> None:
    """A first writer whose work waits until every follower is queued behind its group."""
    queued = threading.Event()
    threads = [threading.Thread(target=_write, args=(groups, sessions, name, work, out), daemon=True)
               for name, work in followers]

    def first(unit: SqlUnitOfWork) -> str:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while groups.waiting() < len(threads) and time.monotonic() < deadline:
            time.sleep(0.005)
        queued.set()
        return _adding("t0")(unit)

    _write(groups, sessions, "t0", first, out)
    _joined(threads, 20)
    assert queued.is_set()


def test_writers_that_wait_at_once_commit_in_one_group_each_with_its_audit_record(
        sessions: sessionmaker[Session]) -> None:
    groups = WriteGroups()
    out: dict[str, Any] = {}
    _held_open(groups, sessions, [(f"t{i}", _adding(f"t{i}")) for i in range(1, 6)], out)

    assert {k: v for k, v in out.items() if not k.endswith(".audit")} == {f"t{i}": f"t{i}" for i in range(6)}
    assert (groups.groups, groups.writes) == (2, 6)  # the first alone, then the five that waited for it
    assert all(out[f"t{i}.audit"]["outcome"] == 201 for i in range(6))
    tunnels, events, audited = _stored(sessions)
    assert tunnels == {f"t{i}" for i in range(6)}
    assert sorted(events) == sorted(tunnels)
    assert sorted(audited) == sorted(f"/v1/tunnels/t{i}" for i in range(6))


def test_a_write_that_fails_leaves_nothing_and_the_others_are_written_without_it(
        sessions: sessionmaker[Session]) -> None:
    def refuse() -> None:
        raise Conflict("its inputs changed")

    groups = WriteGroups()
    out: dict[str, Any] = {}
    # t2 fails after it wrote its record; t3 finds its id taken (by t0): neither may leave anything
    _held_open(groups, sessions, [("t1", _adding("t1")), ("t2", _adding("t2", then=refuse)),
                                  ("t3", _adding("t0")), ("t4", _adding("t4"))], out)

    assert isinstance(out["t2"], Conflict)
    assert isinstance(out["t3"], AlreadyExists)
    assert (out["t0"], out["t1"], out["t4"]) == ("t0", "t1", "t4")
    assert out["t2.audit"] is None
    assert out["t3.audit"] is None
    tunnels, events, audited = _stored(sessions)
    assert tunnels == {"t0", "t1", "t4"}
    assert sorted(events) == ["t0", "t1", "t4"]
    assert sorted(audited) == ["/v1/tunnels/t0", "/v1/tunnels/t1", "/v1/tunnels/t4"]


def test_a_commit_that_fails_is_every_writers_error_and_nothing_is_kept(
        sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    groups = WriteGroups()
    out: dict[str, Any] = {}
    real = SqlUnitOfWork.commit
    failing = {"left": 1}

    def commit(self: SqlUnitOfWork) -> None:
        if failing["left"] and self.session.in_transaction():
            failing["left"] -= 1
            raise OperationalError("COMMIT", {}, Exception("disk I/O error"))
        real(self)

    monkeypatch.setattr(SqlUnitOfWork, "commit", commit)
    _write(groups, sessions, "t0", _adding("t0"), out)

    assert isinstance(out["t0"], OperationalError)
    assert out["t0.audit"] is None
    assert _stored(sessions) == (set(), [], [])
    _write(groups, sessions, "t1", _adding("t1"), out)  # the next group is written as usual
    assert out["t1"] == "t1"


def test_a_unit_holding_uncommitted_changes_writes_them_with_its_work_alone(
        sessions: sessionmaker[Session]) -> None:
    groups = WriteGroups()
    unit, pending = _writer(sessions, "t0", groups)
    try:
        unit.events.append("note", "before", {})
        assert unit.commit_with(_adding("t0")) == "t0"
    finally:
        unit.session.close()
    assert groups.groups == 0
    assert pending.committed is not None  # written by the session's own commit, as without groups
    with sessions() as s:
        assert set(s.scalars(select(EventRow.subject).where(EventRow.kind.in_(["note", "tunnel.created"])))) == {
            "before", "t0"}


def test_a_burst_of_writers_is_written_once_each_and_none_waits_for_ever(sessions: sessionmaker[Session]) -> None:
    groups = WriteGroups(limit=8)
    out: dict[str, Any] = {}
    names = [f"w{i}" for i in range(60)]
    threads = [threading.Thread(target=_write, args=(groups, sessions, name, _adding(name), out), daemon=True)
               for name in names]
    for t in threads:
        t.start()
    _joined(threads, 30)

    assert {name: out[name] for name in names} == {name: name for name in names}
    assert groups.writes == 60
    assert groups.groups < 60  # some waited together
    assert groups.waiting() == 0
    tunnels, events, audited = _stored(sessions)
    assert tunnels == set(names)
    assert sorted(events) == sorted(names)
    assert len(audited) == 60


def test_the_metrics_show_the_groups_and_the_writes_they_held(sessions: sessionmaker[Session]) -> None:
    from prometheus_client import CollectorRegistry

    from app.adapters.metrics import WriteGateCounts

    groups = WriteGroups()
    out: dict[str, Any] = {}
    _held_open(groups, sessions, [("t1", _adding("t1")), ("t2", _adding("t2"))], out)
    registry = CollectorRegistry()
    registry.register(WriteGateCounts(groups))
    assert registry.get_sample_value("qoss_sqlite_write_groups_total") == 2
    assert registry.get_sample_value("qoss_sqlite_grouped_writes_total") == 3
    waited = registry.get_sample_value("qoss_sqlite_group_wait_seconds_total")
    assert waited == groups.waited > 0  # the two behind the first waited for it


def test_a_group_holds_at_least_one_write() -> None:
    with pytest.raises(ValueError, match="at least one"):
        WriteGroups(limit=0)
