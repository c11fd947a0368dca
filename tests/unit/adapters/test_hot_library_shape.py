"""What app/adapters/db/hot.py relies on in SQLAlchemy beyond its public API, checked against
the pinned version: an upgrade that changes any of it fails here, naming SQLAlchemy and its
version (QOSS_FAST_PATHS=false runs every statement through ``Connection.execute`` meanwhile).
The outputs of the two paths are compared on both databases in tests/integration/db/test_hot.py."""

from __future__ import annotations

import inspect
import sqlite3
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Integer, Numeric, String, bindparam, column, create_engine, event, insert, select, table
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.dialects.sqlite import pysqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.compiler import SQLCompiler

from app.adapters.db.hot import WATCHED_DIALECT_EVENTS, WATCHED_EVENTS, HotStatement, goes_hot, hot_transaction
from app.adapters.db.models import UtcDateTime
from tests.fixtures.library_pins import assert_pinned

SA = assert_pinned("sqlalchemy", "app/adapters/db/hot.py")
_T = table("t", column("id", Integer), column("name", String), column("amount", Numeric(10, 2)),
           column("at", UtcDateTime()))


def _shape(ok: bool, what: str) -> None:
    assert ok, f"SQLAlchemy {SA}: {what} changed; app/adapters/db/hot.py relies on it (QOSS_FAST_PATHS=false avoids it)"


@pytest.mark.parametrize("dialect", [pysqlite.dialect(), pg_psycopg.dialect()], ids=["sqlite", "postgresql"])
def test_the_compiler_gives_sql_bind_order_and_binds(dialect: Dialect) -> None:
    statement = select(_T.c.name).where(_T.c.id == bindparam("id"), _T.c.name == "fixed", _T.c.at < bindparam("at"))
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
    _shape(isinstance(compiled, SQLCompiler) and isinstance(compiled.string, str), "Select.compile(): an SQLCompiler")
    _shape(isinstance(compiled.binds, dict) and {"id", "at"} <= set(compiled.binds), "SQLCompiler.binds")
    if dialect.positional:
        _shape(list(compiled.positiontup or ()) == ["id", "name_1", "at"], "SQLCompiler.positiontup")
    else:
        _shape(dialect.paramstyle == "pyformat" and "%(id)s" in compiled.string, "the dialect's named paramstyle")
    fixed = compiled.binds["name_1"]
    _shape(not fixed.required and fixed.effective_value == "fixed", "BindParameter.required / effective_value")
    _shape(compiled.binds["id"].required, "BindParameter.required")


@pytest.mark.parametrize("dialect", [pysqlite.dialect(), pg_psycopg.dialect()], ids=["sqlite", "postgresql"])
def test_type_processors_take_the_dialect_and_the_dbapis_type_code(dialect: Dialect) -> None:
    at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    bind = UtcDateTime().dialect_impl(dialect).bind_processor(dialect)
    stored = at if bind is None else bind(at)
    result = UtcDateTime().dialect_impl(dialect).result_processor(dialect, None)
    _shape((stored if result is None else result(stored)) == at, "TypeEngine bind_processor/result_processor")
    params = list(inspect.signature(Numeric().dialect_impl(dialect).result_processor).parameters)
    _shape(params == ["dialect", "coltype"], "TypeEngine.result_processor(dialect, coltype)")
    if dialect.name == "postgresql":  # the type code decides: NUMERIC (1700) gives Decimal, FLOAT8 (701) float
        numeric = Numeric().dialect_impl(dialect)
        convert = numeric.result_processor(dialect, 1700)
        _shape(Decimal("1.5") == (Decimal("1.5") if convert is None else convert(Decimal("1.5"))),
               "postgresql Numeric result_processor by OID")


def test_dbapi_error_instance_wraps_with_parameters_hidden() -> None:
    dialect = pysqlite.dialect(dbapi=sqlite3)
    signature = inspect.signature(DBAPIError.instance)
    _shape({"statement", "params", "orig", "dbapi_base_err", "hide_parameters", "dialect"} <= set(signature.parameters),
           "DBAPIError.instance's parameters")
    wrapped = DBAPIError.instance("INSERT x", {"v": "secret-looking"}, sqlite3.IntegrityError("UNIQUE"),
                                  sqlite3.Error, hide_parameters=True, dialect=dialect)
    _shape(isinstance(wrapped, IntegrityError) and "secret-looking" not in str(wrapped), "DBAPIError.instance")


@pytest.fixture
def sqlite_engine() -> Any:
    engine = create_engine("sqlite://")
    yield engine
    engine.dispose()


def test_a_raw_connection_gives_the_dbapi_connection_and_the_dialect_its_dbapi(sqlite_engine: Engine) -> None:
    raw = sqlite_engine.raw_connection()
    try:
        _shape(isinstance(raw.driver_connection, sqlite3.Connection), "PoolProxiedConnection.driver_connection")
        _shape(sqlite_engine.dialect.loaded_dbapi.Error is sqlite3.Error, "Dialect.loaded_dbapi")
        _shape(sqlite_engine.dialect.is_disconnect(sqlite3.ProgrammingError("Cannot operate on a closed database."),
                                                   raw.driver_connection, None) is True, "Dialect.is_disconnect")
    finally:
        raw.close()


@pytest.mark.parametrize("name", WATCHED_EVENTS + WATCHED_DIALECT_EVENTS)
def test_a_listener_on_any_watched_event_is_seen_and_makes_the_hot_path_step_aside(
    sqlite_engine: Engine, name: str
) -> None:
    _shape(goes_hot(sqlite_engine), f"an engine without listeners: no {name} listener in engine.dispatch")

    def listener(*_: Any, **__: Any) -> None:
        return None

    event.listen(sqlite_engine, name, listener)
    _shape(not goes_hot(sqlite_engine), f"a {name} listener shows in engine.dispatch / engine.dialect.dispatch")
    with sqlite_engine.connect() as conn:
        _shape(not goes_hot(conn), f"a {name} listener on the engine shows in Connection.dispatch")
    event.remove(sqlite_engine, name, listener)
    _shape(goes_hot(sqlite_engine), f"removing the {name} listener empties it again")


def test_hot_and_public_paths_agree_on_rows_and_errors(tmp_path: Any) -> None:
    """The same statements through both paths, on a file database (one a fresh engine each)."""
    from app.adapters.db.engine import make_engine

    url = f"sqlite:///{tmp_path}/shape.db"
    setup = create_engine(url)
    with setup.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, name VARCHAR, amount NUMERIC(10, 2), at VARCHAR)")
    setup.dispose()
    add = HotStatement(lambda _: insert(_T))
    find = HotStatement(lambda _: select(_T.c.id, _T.c.name, _T.c.amount, _T.c.at).where(_T.c.id >= bindparam("low"))
                        .order_by(_T.c.id))
    at = datetime(2031, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    seen = []
    for fast_paths, first_id in ((True, 1), (False, 11)):
        engine = make_engine(url, fast_paths=fast_paths)
        try:
            with hot_transaction(engine) as cursor:
                for i in range(first_id, first_id + 3):
                    cursor.execute(add, {"id": i, "name": f"n{i - first_id}", "amount": Decimal("1.25") * i, "at": at})
                rows = cursor.all(find, {"low": first_id})
                one = cursor.first(find, {"low": first_id + 2})
                none = cursor.first(find, {"low": 999})
            with pytest.raises(IntegrityError) as caught, hot_transaction(engine) as cursor:
                cursor.execute(add, {"id": first_id, "name": "dup", "amount": Decimal(0), "at": at})
            normalised = [(r[0] - first_id, *r[1:3], r[3]) for r in rows]
            amounts = [r[2] / (r[0]) for r in rows]
            seen.append((normalised == [(i, f"n{i}", Decimal("1.25") * (i + first_id), at) for i in range(3)],
                         amounts, one is not None and one[3] == at, none, type(caught.value.orig),
                         "dup" not in str(caught.value)))
        finally:
            engine.dispose()
    _shape(seen[0] == seen[1], f"the hot path's rows and errors as Connection.execute's: {seen}")
    assert seen[0][0]
    assert seen[0][2]
    assert seen[0][5]
