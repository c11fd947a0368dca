"""This process's SQLite writers queue on a lock of their own (app/adapters/db/write_gate.py):
held from a write transaction's BEGIN to its end, on the ORM's path and the hot path, shared
by every engine on one file, never by readers, and given back whatever way a transaction ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.hot import goes_hot, hot_transaction
from app.adapters.db.write_gate import WriteGate, gate_of


@pytest.fixture
def database(tmp_path: Path) -> Iterator[tuple[str, list[Engine]]]:
    url = f"sqlite:///{tmp_path}/gate.db"
    engines: list[Engine] = []
    yield url, engines
    for engine in engines:
        engine.dispose()


def _engine(database: tuple[str, list[Engine]], **kw: Any) -> Engine:
    url, engines = database
    engine = make_engine(url, **kw)
    engines.append(engine)
    return engine


def test_a_session_holds_the_gate_from_its_first_statement_to_its_commit_or_rollback(
        database: tuple[str, list[Engine]]) -> None:
    engine = _engine(database)
    gate = gate_of(engine)
    assert gate is not None
    assert not gate.held()
    factory = make_session_factory(engine)
    with factory() as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
        assert gate.held()
        session.commit()
        assert not gate.held()
        session.execute(text("INSERT INTO t VALUES (1)"))
        assert gate.held()
        session.rollback()
        assert not gate.held()
        session.execute(text("INSERT INTO t VALUES (2)"))
    assert not gate.held()  # closed without an end: given back with the connection


def test_the_hot_path_holds_the_gate_and_stays_hot(database: tuple[str, list[Engine]]) -> None:
    engine = _engine(database)
    gate = gate_of(engine)
    assert gate is not None
    assert goes_hot(engine)  # the gate listens to no event that takes statements off the hot path
    with make_session_factory(engine)() as session, session.begin():
        session.execute(text("CREATE TABLE t (x INTEGER)"))
    with hot_transaction(engine) as cursor:
        cursor._cursor.execute("INSERT INTO t VALUES (1)")
        assert gate.held()
    assert not gate.held()

    def fails() -> None:
        with hot_transaction(engine) as cursor:
            cursor._cursor.execute("INSERT INTO t VALUES (2)")
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        fails()
    assert not gate.held()


def test_readers_never_take_it(database: tuple[str, list[Engine]]) -> None:
    writer, reader = _engine(database), _engine(database, writes=False)
    assert gate_of(reader) is None
    gate = gate_of(writer)
    assert gate is not None
    with make_session_factory(writer)() as w, make_session_factory(reader)() as r:
        w.execute(text("CREATE TABLE t (x INTEGER)"))
        w.commit()
        w.execute(text("INSERT INTO t VALUES (1)"))
        assert r.execute(text("SELECT count(*) FROM t")).scalar() == 0  # a reader goes by a held gate
        w.commit()


def test_a_second_writer_waits_at_the_gate_not_on_sqlites_lock(database: tuple[str, list[Engine]]) -> None:
    """The second engine's SQLite would refuse at once ("database is locked", busy timeout 0) if
    its writer reached BEGIN IMMEDIATE while the first held the lock: it reaches it only after."""
    first, second = _engine(database), _engine(database)
    assert gate_of(first) is gate_of(second)  # one gate per file

    @event.listens_for(second, "connect")
    def _impatient(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout=0")

    with make_session_factory(first)() as s, s.begin():
        s.execute(text("CREATE TABLE t (x INTEGER)"))
    order: list[str] = []
    waiting = threading.Event()
    errors: list[BaseException] = []

    def later() -> None:
        try:
            with make_session_factory(second)() as session:
                waiting.set()
                session.execute(text("INSERT INTO t VALUES (2)"))
                order.append("second in")
                session.commit()
        except BaseException as exc:  # reported below
            errors.append(exc)

    with make_session_factory(first)() as session:
        session.execute(text("INSERT INTO t VALUES (1)"))
        thread = threading.Thread(target=later)
        thread.start()
        assert waiting.wait(5)
        thread.join(0.3)
        assert thread.is_alive()  # still at the gate
        order.append("first out")
        session.commit()
    thread.join(10)
    assert not thread.is_alive()
    assert not errors, errors
    assert order == ["first out", "second in"]


def test_a_writer_that_cannot_have_the_gate_in_time_goes_on_without_it() -> None:
    gate = WriteGate()
    holder: dict[str, Any] = {}
    gate.enter(holder, timeout=1)
    other: dict[str, Any] = {}
    gate.enter(other, timeout=0.05)
    assert (gate.entered, gate.bypassed) == (1, 1)
    gate.leave(other)  # it never had it: nothing given back
    assert gate.held()
    gate.leave(holder)
    gate.leave(holder)  # a second end gives nothing back twice
    assert not gate.held()


def test_the_gate_counts_the_time_writers_waited_and_held_it() -> None:
    gate = WriteGate()
    first: dict[str, Any] = {}
    gate.enter(first, timeout=1)
    done = threading.Event()

    def second() -> None:
        mine: dict[str, Any] = {}
        gate.enter(mine, timeout=10)
        gate.leave(mine)
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not done.wait(0.2)  # the second writer waits while the first holds the gate
    gate.leave(first)
    thread.join(10)
    assert gate.entered == 2
    assert gate.waited >= 0.2  # the second writer's wait, at least
    assert gate.busy >= 0.2  # the first writer's hold, at least
    assert gate.busy <= gate.waited + 1.0  # each hold is counted once, not per waiter


def test_the_metrics_show_each_database_files_writes_waits_and_holds(database: tuple[str, list[Engine]]) -> None:
    from prometheus_client import CollectorRegistry

    from app.adapters.metrics import WriteGateCounts

    engine = _engine(database)
    with make_session_factory(engine)() as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
        session.commit()
    registry = CollectorRegistry()
    registry.register(WriteGateCounts())
    path = engine.url.database
    assert path is not None
    labels = {"database": str(Path(path).resolve())}
    gate = gate_of(engine)
    assert gate is not None
    assert registry.get_sample_value("qoss_sqlite_writes_total", labels) == gate.entered >= 1
    assert registry.get_sample_value("qoss_sqlite_write_held_seconds_total", labels) == gate.busy > 0
    assert registry.get_sample_value("qoss_sqlite_write_wait_seconds_total", labels) == gate.waited
