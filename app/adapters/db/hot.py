"""Hot-path statements: compiled by SQLAlchemy once per dialect, run on the DBAPI cursor.

Every tunnel-agent message spends a few short transactions (a user lookup, replay-cache
inserts, a lease, a session row). Measured on SQLite, SQLAlchemy's execution layer costs
several times the statement itself (a Host check: 47 us on the bare ``sqlite3`` cursor,
355 us through a Session; ``benchmarks/agent_join.py`` shows it in the join time). So
these statements are still written as SQLAlchemy Core constructs and compiled by
SQLAlchemy for the engine's dialect (its SQL, its parameter style, its type conversions:
``UtcDateTime``, JSON), but executed directly on the DBAPI cursor:

* :class:`HotStatement` keeps, per dialect, the SQL text, the parameter order and each
  parameter's and result column's type processor (``TypeEngine.bind_processor`` /
  ``result_processor`` of the dialect's implementation); values without a processor pass
  through unchanged. No Python-side column defaults run: callers give every value.
* :func:`hot_transaction` checks a DBAPI connection out of the engine's pool (pre-ping and
  all), opens the transaction the way :func:`~app.adapters.db.engine.make_engine` does
  (``BEGIN IMMEDIATE`` on SQLite), commits or rolls back, and gives the connection back.
* :func:`session_cursor` runs hot statements inside a Session's own transaction (its
  connection), for transactions that also need the ORM.

DBAPI errors come out as SQLAlchemy's (``IntegrityError``, ``OperationalError``...), with
parameters hidden, so callers handle them as they would any SQLAlchemy error; a connection
the error shows to be dead is invalidated, not pooled again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import Executable

__all__ = ["HOT_DIALECTS", "HotCursor", "HotStatement", "engine_of", "hot_transaction", "session_cursor"]

Processor = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]
    positional: bool
    binds: tuple[Processor | None, ...]
    results: tuple[Processor | None, ...]


#: The databases the hot path runs on (the ones qoss supports and tests).
HOT_DIALECTS = frozenset({"sqlite", "postgresql"})


class HotStatement:
    """A Core statement (with named ``bindparam``s) compiled once per dialect (see the module).

    ``build`` gives the statement for a dialect name (``sqlite`` or ``postgresql``), so a
    statement may use a dialect's own constructs (``ON CONFLICT DO NOTHING``).
    """

    __slots__ = ("_build", "_by_dialect", "_lock")

    def __init__(self, build: Callable[[str], Executable]) -> None:
        self._build = build
        self._by_dialect: dict[str, _Compiled] = {}
        self._lock = threading.Lock()

    def compiled(self, dialect: Dialect) -> _Compiled:
        found = self._by_dialect.get(dialect.name)
        if found is not None:
            return found
        if dialect.name not in HOT_DIALECTS:
            raise NotImplementedError(f"the hot path runs on SQLite and PostgreSQL, not {dialect.name}")
        with self._lock:
            statement = self._build(dialect.name)
            compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
            names = tuple(compiled.positiontup or ()) if dialect.positional else tuple(compiled.binds)
            binds = tuple(compiled.binds[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names)
            columns = getattr(statement, "exported_columns", ())  # SELECT's columns, or RETURNING's
            results = tuple(c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns)
            found = _Compiled(compiled.string, names, dialect.positional, binds, results)
            self._by_dialect[dialect.name] = found
        return found


class HotCursor:
    """Runs :class:`HotStatement` s on one DBAPI connection (inside a transaction someone else owns)."""

    __slots__ = ("_cursor", "_dbapi", "dialect")

    def __init__(self, dbapi_connection: Any, dialect: Dialect) -> None:
        self._dbapi = dbapi_connection
        self._cursor = dbapi_connection.cursor()
        self.dialect = dialect

    def _execute(self, statement: HotStatement, params: Mapping[str, Any]) -> _Compiled:
        c = statement.compiled(self.dialect)
        values = [params[n] if p is None else p(params[n]) for n, p in zip(c.names, c.binds, strict=True)]
        try:
            self._cursor.execute(c.sql, values if c.positional else dict(zip(c.names, values, strict=True)))
        except self.dialect.loaded_dbapi.Error as exc:
            raise _wrapped(c.sql, exc, self.dialect) from exc
        return c

    def first(self, statement: HotStatement, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The first row (converted by the columns' types), or None; the rest is discarded."""
        c = self._execute(statement, params)
        try:
            row = self._cursor.fetchone()
            if self._cursor.description is not None:
                self._cursor.fetchall()  # psycopg: leave nothing pending on the cursor
        except self.dialect.loaded_dbapi.Error as exc:
            raise _wrapped(c.sql, exc, self.dialect) from exc
        if row is None:
            return None
        return tuple(v if p is None else p(v) for v, p in zip(row, c.results, strict=False))

    def execute(self, statement: HotStatement, params: Mapping[str, Any]) -> int:
        """Run a statement that returns no rows; the row count."""
        self._execute(statement, params)
        return int(self._cursor.rowcount)

    def close(self) -> None:
        self._cursor.close()


def _wrapped(sql: str, exc: Exception, dialect: Dialect) -> StatementError:
    return DBAPIError.instance(sql, None, exc, dialect.loaded_dbapi.Error, hide_parameters=True, dialect=dialect)


@contextmanager
def hot_transaction(engine: Engine) -> Iterator[HotCursor]:
    """A write transaction on a pooled DBAPI connection: committed if the block ends normally,
    rolled back if it raises (see the module)."""
    dialect = engine.dialect
    raw = engine.raw_connection()
    cursor: HotCursor | None = None
    dead = False
    try:
        cursor = HotCursor(raw.driver_connection, dialect)
        if dialect.name == "sqlite":  # isolation_level None (make_engine): we open it, IMMEDIATE
            cursor._cursor.execute("BEGIN IMMEDIATE")
        try:
            yield cursor
            raw.commit()
        except BaseException:
            try:
                raw.rollback()
            except dialect.loaded_dbapi.Error:
                dead = True
            raise
    except dialect.loaded_dbapi.Error as exc:
        dead = _is_disconnect(dialect, exc, raw)
        raise _wrapped("BEGIN/COMMIT", exc, dialect) from exc
    except DBAPIError as exc:
        dead = dead or bool(exc.orig is not None and _is_disconnect(dialect, exc.orig, raw))
        raise
    finally:
        if cursor is not None:
            try:
                cursor.close()
            except dialect.loaded_dbapi.Error:
                dead = True
        if dead:
            raw.invalidate()
        raw.close()


def _is_disconnect(dialect: Dialect, exc: BaseException, raw: Any) -> bool:
    return isinstance(exc, dialect.loaded_dbapi.Error) and bool(dialect.is_disconnect(exc, raw.driver_connection, None))


def session_cursor(session: Session) -> HotCursor:
    """A :class:`HotCursor` on the Session's connection: statements run in its transaction
    (begun if it was not). Close it when done."""
    connection = session.connection()
    return HotCursor(connection.connection.driver_connection, connection.dialect)



def engine_of(session_factory: Callable[[], Session]) -> Engine:
    """The engine the factory's sessions are bound to, once it is known to run hot statements.

    Raises:
        ValueError: a database other than SQLite or PostgreSQL (said at start-up, not on a request).
    """
    with session_factory() as session:
        bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    if engine.dialect.name not in HOT_DIALECTS:
        raise ValueError(f"the tunnel agent keeps its state in SQLite or PostgreSQL, not {engine.dialect.name}")
    return engine
