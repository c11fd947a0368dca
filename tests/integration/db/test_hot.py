"""The hot path (app/adapters/db/hot.py) on SQLite and PostgreSQL: what it writes reads back
through the ORM exactly as the ORM would have written it; transactions commit or leave nothing;
errors come out as SQLAlchemy's, without the values; a dead connection is not pooled again.
Engine listeners see its statements (it steps aside for them), Numeric columns convert, and
with QOSS_FAST_PATHS off the public path gives the same rows and errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Float, Integer, Numeric, Table, bindparam, create_engine, event, select, text
from sqlalchemy import cast as sa_cast
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.agent import NonceRepository, SessionRepository
from app.adapters.db.agent_hot import claim_nonce, find_user
from app.adapters.db.agent_rows import AgentNonceRow, AgentSessionRow, AgentUserRow
from app.adapters.db.engine import FAST_PATHS_OPTION, make_engine
from app.adapters.db.hot import (
    HotStatement,
    HotTransaction,
    engine_of,
    goes_hot,
    hot_transaction,
    session_cursor,
)
from app.domain.agent import AgentSessionState, b64e
from app.domain.agent.ports import AgentSession
from tests.fixtures.db import postgres_database


def _enrol(factory: sessionmaker[Session], user_id: str = "alice", revoked: bool = False) -> None:
    with factory() as session, session.begin():
        session.add(AgentUserRow(user_id=user_id, sign_public_key=b64e(b"s" * 32), kem_public_key=b64e(b"k" * 32),
                                 objectives=[3, 1], revoked_at=datetime.now(UTC) if revoked else None))


def test_a_hot_insert_reads_back_through_the_orm_with_its_types(
    engine: Engine, session_factory: sessionmaker[Session]
) -> None:
    expires = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    with hot_transaction(engine) as cursor:
        assert claim_nonce(cursor, "host", "user:alice", b"\x01" * 16, expires) is True
    with session_factory() as session:
        row = session.get(AgentNonceRow, ("host", "user:alice", "01" * 16))
        assert row is not None
        assert row.expires_at == expires
        assert row.expires_at.tzinfo is UTC


def test_a_session_row_written_hot_has_its_json_defaults_and_times(session_factory: sessionmaker[Session]) -> None:
    suite = {"esp": "aes128gcm16-x25519", "levels": {"c": 7}, "notes": ["a", "b"]}
    expires = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    with session_factory() as session, session.begin():
        SessionRepository(session).add(AgentSession(
            ticket="t" * 32, user_id="alice", host_id="host-1", request_id="r" * 32, objective_id=3,
            protection="esp", conn="qoss-agent-x", pool="qoss-agent-x", virtual_ip="10.8.0.2",
            client_identity="abc.alice", suite=suite, state=AgentSessionState.ACTIVE.value, expires_at=expires))
    with session_factory() as session:
        row = session.get(AgentSessionRow, "t" * 32)
        assert row is not None
        assert row.suite == suite
        assert row.reason == ""
        assert row.expires_at == expires
        assert row.created_at.tzinfo is UTC
        assert row.updated_at == row.created_at
        assert abs((datetime.now(UTC) - row.created_at).total_seconds()) < 60


def test_find_user_gives_the_record_or_none(engine: Engine, session_factory: sessionmaker[Session]) -> None:
    _enrol(session_factory, "alice")
    _enrol(session_factory, "bob", revoked=True)
    with hot_transaction(engine) as cursor:
        alice, bob, nobody = (find_user(cursor, u) for u in ("alice", "bob", "carol"))
    assert alice is not None
    assert alice.objectives == frozenset({1, 3})
    assert not alice.revoked
    assert alice.sign_public_key == b"s" * 32
    assert alice.kem_public_key == b"k" * 32
    assert bob is not None
    assert bob.revoked
    assert nobody is None


def test_a_replayed_nonce_is_refused_and_does_not_abort_the_transaction(
    engine: Engine, session_factory: sessionmaker[Session]
) -> None:
    later = datetime.now(UTC) + timedelta(minutes=5)
    with hot_transaction(engine) as cursor:
        assert claim_nonce(cursor, "target", "host:h", b"\x02" * 16, later)
        assert not claim_nonce(cursor, "target", "host:h", b"\x02" * 16, later)
        assert claim_nonce(cursor, "target", "host:h", b"\x03" * 16, later)  # the transaction goes on
    with session_factory() as session:
        assert len(session.scalars(select(AgentNonceRow)).all()) == 2


def test_a_block_that_raises_leaves_nothing(engine: Engine, session_factory: sessionmaker[Session]) -> None:
    def claim_then_refuse() -> None:
        with hot_transaction(engine) as cursor:
            claim_nonce(cursor, "host", "user:alice", b"\x04" * 16, datetime.now(UTC))
            raise RuntimeError("refused after the insert")

    with pytest.raises(RuntimeError, match="refused"):
        claim_then_refuse()
    with session_factory() as session:
        assert session.scalars(select(AgentNonceRow)).all() == []
    with hot_transaction(engine) as cursor:  # the connection went back to the pool clean
        assert claim_nonce(cursor, "host", "user:alice", b"\x04" * 16, datetime.now(UTC))


def test_hot_statements_run_in_the_sessions_own_transaction(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        session.begin()
        assert NonceRepository(session).claim("host", "user:a", b"\x05" * 16, datetime.now(UTC))
        session.rollback()
        assert NonceRepository(session).claim("host", "user:a", b"\x05" * 16, datetime.now(UTC))  # rolled back
        session.commit()
    with session_factory() as session:
        assert len(session.scalars(select(AgentNonceRow)).all()) == 1


def test_a_duplicate_key_is_sqlalchemys_integrity_error_without_the_values(
    engine: Engine, session_factory: sessionmaker[Session]
) -> None:
    users = cast(Table, AgentUserRow.__table__)
    plain_insert = HotStatement(lambda _: users.insert())  # no ON CONFLICT: a duplicate fails
    values = {"user_id": "alice", "sign_public_key": "secret-looking-value", "kem_public_key": "k", "objectives": [1],
              "created_at": datetime.now(UTC), "revoked_at": None, "mlkem_public_key": None}
    with hot_transaction(engine) as cursor:
        cursor.execute(plain_insert, values)
    with pytest.raises(IntegrityError) as caught, hot_transaction(engine) as cursor:
        cursor.execute(plain_insert, values)
    assert "secret-looking-value" not in str(caught.value)
    with session_factory() as session:  # the failed transaction left the first row alone
        assert [u.user_id for u in session.scalars(select(AgentUserRow))] == ["alice"]


def test_a_statement_for_another_database_is_refused_clearly() -> None:
    statement = HotStatement(lambda _: select(AgentUserRow.__table__).where(
        AgentUserRow.__table__.c.user_id == bindparam("user_id")))
    with pytest.raises(NotImplementedError, match="SQLite and PostgreSQL"):
        statement.compiled(mysql.dialect())


def test_engine_of_and_session_cursor_share_the_factorys_database(
    engine: Engine, session_factory: sessionmaker[Session]
) -> None:
    assert engine_of(session_factory).url == engine.url
    with session_factory() as session, session.begin(), session_cursor(session) as cursor:
        assert find_user(cursor, "nobody") is None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


def _kill_other_backends(url: str) -> None:
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            killed = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar()
        assert killed == 1
    finally:
        admin.dispose()


@pytest.mark.postgres
def test_a_dead_pooled_connection_is_replaced_on_checkout(postgres_url: str) -> None:
    engine = make_engine(postgres_url)  # pre-ping on checkout
    try:
        with hot_transaction(engine) as cursor:
            claim_nonce(cursor, "host", "user:z", b"\x06" * 16, datetime.now(UTC))
        _kill_other_backends(postgres_url)
        with hot_transaction(engine) as cursor:
            assert claim_nonce(cursor, "host", "user:z", b"\x07" * 16, datetime.now(UTC))
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_connection_that_dies_in_use_is_invalidated_not_pooled_again(postgres_url: str) -> None:
    engine = create_engine(postgres_url, pool_size=1, max_overflow=0)  # no pre-ping: the error shows in use
    try:
        with hot_transaction(engine) as cursor:
            claim_nonce(cursor, "host", "user:z", b"\x08" * 16, datetime.now(UTC))
        _kill_other_backends(postgres_url)
        with pytest.raises(OperationalError) as caught, hot_transaction(engine) as cursor:
            claim_nonce(cursor, "host", "user:z", b"\x09" * 16, datetime.now(UTC))
        assert "user:z" not in str(caught.value)
        with hot_transaction(engine) as cursor:  # a new connection, not the dead one
            assert claim_nonce(cursor, "host", "user:z", b"\x09" * 16, datetime.now(UTC))
    finally:
        engine.dispose()


def test_a_statements_own_literals_need_no_parameters(engine: Engine, session_factory: sessionmaker[Session]) -> None:
    _enrol(session_factory, "alice")
    _enrol(session_factory, "bob")
    bob_only = HotStatement(lambda _: select(AgentUserRow.user_id).where(AgentUserRow.user_id == "bob"))
    with hot_transaction(engine) as cursor:
        assert cursor.all(bob_only, {}) == [("bob",)]


@pytest.mark.postgres
def test_a_commit_the_database_refuses_is_sqlalchemys_error_and_leaves_the_connection_usable(
    postgres_url: str,
) -> None:
    """PostgreSQL checks a deferred constraint at COMMIT: the commit fails, the transaction is
    rolled back and the (healthy) connection goes back to the pool in a usable state."""
    engine = create_engine(postgres_url, pool_size=1, max_overflow=0, pool_pre_ping=True)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE deferred_check (x int UNIQUE DEFERRABLE INITIALLY DEFERRED)"))
        insert_one = HotStatement(lambda _: text("INSERT INTO deferred_check VALUES (1)"))
        transaction = HotTransaction(engine)
        try:
            transaction.cursor.execute(insert_one, {})
            transaction.cursor.execute(insert_one, {})  # accepted for now: checked at COMMIT
            with pytest.raises(IntegrityError):
                transaction.commit()
        finally:
            transaction.close()
        with hot_transaction(engine) as cursor:  # the one pooled connection, usable again
            cursor.execute(insert_one, {})
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM deferred_check")).scalar() == 1
    finally:
        engine.dispose()


# -- what the hot path must not hide, and its public twin -------------------------------


def _seen_statements(engine: Engine) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    return seen


def test_a_before_cursor_execute_listener_sees_every_hot_statement(
    engine: Engine, session_factory: sessionmaker[Session]
) -> None:
    """Query logs and tracers listen on the engine: with a listener there, the hot path steps
    aside and every statement goes through SQLAlchemy's execution, where the listener sees it."""
    _enrol(session_factory, "alice")
    seen = _seen_statements(engine)
    assert not goes_hot(engine)
    with hot_transaction(engine) as cursor:
        assert claim_nonce(cursor, "host", "user:alice", b"\x07" * 16, datetime.now(UTC))
        found = find_user(cursor, "alice")
    assert found is not None
    assert found.objectives == frozenset({1, 3})
    with session_factory() as session, session.begin():
        assert NonceRepository(session).claim("host", "user:alice", b"\x08" * 16, datetime.now(UTC))
    assert sum("agent_nonces" in s for s in seen) == 2, seen
    assert any("agent_users" in s for s in seen), seen


def test_a_handle_error_listener_sees_a_hot_statements_error(engine: Engine) -> None:
    users = cast(Table, AgentUserRow.__table__)
    plain_insert = HotStatement(lambda _: users.insert())
    values = {"user_id": "alice", "sign_public_key": "s", "kem_public_key": "k", "objectives": [1],
              "created_at": datetime.now(UTC), "revoked_at": None, "mlkem_public_key": None}
    errors: list[type[BaseException]] = []
    event.listen(engine, "handle_error", lambda context: errors.append(type(context.sqlalchemy_exception)))
    with hot_transaction(engine) as cursor:
        cursor.execute(plain_insert, values)
    with pytest.raises(IntegrityError), hot_transaction(engine) as cursor:
        cursor.execute(plain_insert, values)
    assert errors == [IntegrityError]


def test_without_listeners_and_with_fast_paths_on_statements_go_hot(engine: Engine) -> None:
    assert goes_hot(engine)
    with engine.connect() as conn:
        assert goes_hot(conn)
        assert not goes_hot(conn.execution_options(**{FAST_PATHS_OPTION: False}))


_NUMBERS = HotStatement(lambda _: select(
    sa_cast(bindparam("amount", type_=Numeric(10, 2)), Numeric(10, 2)).label("amount"),
    sa_cast(bindparam("ratio", type_=Float()), Float()).label("ratio"),
    sa_cast(bindparam("count", type_=Integer()), Numeric(12, 0)).label("count"),
))


@pytest.mark.parametrize("fast_paths", [True, False], ids=["hot", "public"])
def test_numeric_result_columns_are_converted_on_both_databases(database_url: str, fast_paths: bool) -> None:
    """PostgreSQL's Numeric needs the column's type code (Decimal or float by OID): the hot
    path takes it from the cursor's description, as SQLAlchemy's results do."""
    engine = make_engine(database_url, fast_paths=fast_paths)
    try:
        assert goes_hot(engine) is fast_paths
        with hot_transaction(engine) as cursor:
            row = cursor.first(_NUMBERS, {"amount": Decimal("12.34"), "ratio": 0.5, "count": 7})
            rows = cursor.all(_NUMBERS, {"amount": Decimal("-1.50"), "ratio": 2.25, "count": 0})
        assert row == (Decimal("12.34"), 0.5, Decimal("7"))
        assert isinstance(row[0], Decimal)
        assert rows == [(Decimal("-1.50"), 2.25, Decimal("0"))]
    finally:
        engine.dispose()


def test_the_hot_and_the_public_path_give_the_same_rows_and_errors(
    database_url: str, session_factory: sessionmaker[Session]
) -> None:
    """The same statements, inputs and failures through both paths (QOSS_FAST_PATHS on and off)."""
    _enrol(session_factory, "alice")
    _enrol(session_factory, "bob", revoked=True)
    users = cast(Table, AgentUserRow.__table__)
    plain_insert = HotStatement(lambda _: users.insert())
    expires = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    outcomes = []
    for fast_paths in (True, False):
        engine = make_engine(database_url, fast_paths=fast_paths)
        nonce = b"\x09" if fast_paths else b"\x0a"
        try:
            assert goes_hot(engine) is fast_paths
            with hot_transaction(engine) as cursor:
                claimed = (claim_nonce(cursor, "host", "user:alice", nonce * 16, expires),
                           claim_nonce(cursor, "host", "user:alice", nonce * 16, expires))
                found = (find_user(cursor, "alice"), find_user(cursor, "bob"), find_user(cursor, "carol"))
                many = cursor.execute_many(HotStatement(lambda _: users.update().where(
                    users.c.user_id == bindparam("who")).values(kem_public_key=bindparam("kem"))),
                    [{"who": "alice", "kem": b64e(b"k" * 32)}, {"who": "bob", "kem": b64e(b"k" * 32)}])
            values = {"user_id": "alice", "sign_public_key": "secret-looking-value", "kem_public_key": "k",
                      "objectives": [1], "created_at": datetime.now(UTC), "revoked_at": None,
                      "mlkem_public_key": None}
            with pytest.raises(IntegrityError) as caught, hot_transaction(engine) as cursor:
                cursor.execute(plain_insert, values)
            assert "secret-looking-value" not in str(caught.value)
            with session_factory() as session:
                row = session.get(AgentNonceRow, ("host", "user:alice", nonce.hex() * 16))
                assert row is not None
                written = row.expires_at
            outcomes.append((claimed, found, many, type(caught.value.orig).__name__, written))
        finally:
            engine.dispose()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == (True, False)
    assert outcomes[0][4] == expires


def test_with_fast_paths_off_a_session_cursor_runs_in_the_sessions_transaction(database_url: str) -> None:
    engine = make_engine(database_url, fast_paths=False)
    try:
        factory = sessionmaker(engine, expire_on_commit=False)
        with factory() as session:
            session.begin()
            connection = session.connection()
            assert not goes_hot(connection)
            assert NonceRepository(session).claim("host", "user:a", b"\x0b" * 16, datetime.now(UTC))
            session.rollback()
            assert NonceRepository(session).claim("host", "user:a", b"\x0b" * 16, datetime.now(UTC))
            session.commit()
        with factory() as session:
            assert len(session.scalars(select(AgentNonceRow)).all()) == 1
    finally:
        engine.dispose()


def _tunnel_statements(database_url: str, fast_paths: bool, tunnel_id: str) -> tuple[Any, ...]:
    """A set-up's and a teardown's statements on one engine: the record written, read back (by a
    session holding no objects: hot when the fast paths are on), its table's revision, the
    record deleted and deleted again, the events committed with them."""
    from app.adapters.db.unit_of_work import sql_units_of_work
    from app.domain.errors import AlreadyExists, NotFound
    from app.domain.tunnels import PeerEnd, TunnelRecord, TunnelState

    engine = make_engine(database_url, fast_paths=fast_paths)
    units = sql_units_of_work(sessionmaker(engine, expire_on_commit=False))
    record = TunnelRecord(id=tunnel_id, initiator="left", responder=None, local_ts=("10.1.0.0/24",),
                          remote_ts=("10.2.0.5/32",), state=TunnelState.UP,
                          negotiation={"suite": {"encryption": "aes128gcm16"}, "levels": [1, 2]},
                          peer=PeerEnd(address="10.2.0.5", identity="peer.example", local_identity="left"),
                          provenance={"tables": {"standards-2026": 1}})
    try:
        assert goes_hot(engine) is fast_paths
        with units() as uow:
            added = uow.tunnels.add(record, keep_transaction=False)
            uow.events.append("tunnel.created", tunnel_id, {"state": "up"}, scope="tunnels:read")
            uow.commit()
        with units() as uow, pytest.raises(AlreadyExists):
            uow.tunnels.add(record, keep_transaction=False)
        with units() as uow:
            read = uow.tunnels.get(tunnel_id)
            revision = uow.tables.current_revision("standards-2026")
            with pytest.raises(NotFound):
                uow.tables.current_revision("no-such-table")
            with pytest.raises(NotFound):
                uow.tunnels.get("no-such-tunnel")
        with units() as uow:
            uow.tunnels.delete(tunnel_id)
            uow.events.append("tunnel.deleted", tunnel_id, {}, scope="tunnels:read")
            uow.commit()
        with units() as uow, pytest.raises(NotFound):
            uow.tunnels.delete(tunnel_id)
        with units() as uow:
            events = [(e["kind"], e["subject"], e["data"]) for e in uow.events.after(0, scopes=None)
                      if e["subject"] == tunnel_id]
        return (added, read, revision, events)
    finally:
        engine.dispose()


def test_a_tunnels_statements_give_the_same_records_hot_and_public(database_url: str) -> None:
    """What a set-up and a teardown write and read (the record, a revision, the events) is the
    same through the hot path and through SQLAlchemy's public one (QOSS_FAST_PATHS off)."""
    from app.bootstrap import prepare_database
    from app.settings import Settings

    prepare_database(Settings(database_url=database_url))  # the shipped rating tables
    hot = _tunnel_statements(database_url, True, "t-hot")
    public = _tunnel_statements(database_url, False, "t-public")
    def strip(r: Any) -> Any:
        return dataclasses.replace(r, id="t", created_at=None, updated_at=None)

    assert [strip(r) for r in hot[:2]] == [strip(r) for r in public[:2]]
    assert hot[1] == hot[0]  # read back as written, times included
    assert public[1] == public[0]
    from app.domain.tunnels import PeerEnd

    assert hot[1].peer == PeerEnd(address="10.2.0.5", identity="peer.example", local_identity="left")
    assert hot[2] == public[2] >= 1
    assert [e[0] for e in hot[3]] == [e[0] for e in public[3]] == ["tunnel.created", "tunnel.deleted"]


@pytest.mark.parametrize("fast_paths", [True, False], ids=["hot", "public"])
def test_a_begin_that_finds_sqlite_locked_is_sqlalchemys_error_and_leaves_nothing_held(
    tmp_path: Any, fast_paths: bool
) -> None:
    """SQLite's BEGIN IMMEDIATE (opened on the DBAPI connection when the fast paths are on)
    refused because another connection holds the write lock: SQLAlchemy's OperationalError
    either way, and the next transaction begins normally once the lock is free."""
    import sqlite3

    from sqlalchemy.orm import sessionmaker as make_sessions

    path = tmp_path / "locked.db"
    engine = make_engine(f"sqlite:///{path}", fast_paths=fast_paths, pool_size=1, max_overflow=0)

    @event.listens_for(engine, "connect")
    def _no_wait(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout=0")

    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        sessions = make_sessions(engine)
        try:
            with sessions() as session, pytest.raises(OperationalError, match="locked"):
                session.execute(text("INSERT INTO t VALUES (1)"))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        with sessions() as session:
            session.execute(text("INSERT INTO t VALUES (2)"))
            session.commit()
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT x FROM t").all() == [(2,)]
    finally:
        engine.dispose()
