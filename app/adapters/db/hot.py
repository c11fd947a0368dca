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
* :class:`HotTransaction` (and :func:`hot_transaction`, its ``with`` form) checks a DBAPI
  connection out of the engine's pool (pre-ping and all), opens the transaction the way
  :func:`~app.adapters.db.engine.make_engine` does (``BEGIN IMMEDIATE`` on SQLite), commits
  or rolls back, and gives the connection back.
* :func:`session_cursor` runs hot statements inside a Session's own transaction (its
  connection), for transactions that also need the ORM.
* :func:`insert_new` (:func:`session_insert_new` in a Session's transaction) inserts a row
  unless its key exists, in one statement: a nonce, a lease, a revocation kept once.

DBAPI errors come out as SQLAlchemy's (``IntegrityError``, ``OperationalError``...), with
parameters hidden, so callers handle them as they would any SQLAlchemy error; a connection
the error shows to be dead is invalidated, not pooled again.

The same statements also run through SQLAlchemy's public execution path
(``Connection.execute``), with the same results and errors, where the hot path steps aside:

* the engine was made with ``fast_paths=False`` (:func:`~app.adapters.db.engine.make_engine`,
  from the ``QOSS_FAST_PATHS`` setting; the engine's execution option
  :data:`~app.adapters.db.engine.FAST_PATHS_OPTION`);
* the engine (or the Session's connection) has a listener for an event that would see the
  statements or the transaction (:data:`WATCHED_EVENTS`, :data:`WATCHED_DIALECT_EVENTS`:
  ``before_cursor_execute``, ``handle_error`` and the like, as query logs and tracers use),
  or ``echo`` on: such listeners see every statement.

What of SQLAlchemy this relies on beyond its public API (``SQLCompiler.positiontup`` and
``binds``, ``DBAPIError.instance``, the dialect's ``loaded_dbapi`` and ``is_disconnect``) is
checked by ``tests/unit/adapters/test_hot_library_shape.py`` against the pinned version.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine, Insert, Table, bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, Executable
from sqlalchemy.types import TypeEngine

from app.adapters.db import write_gate
from app.adapters.db.driver import WATCHED_DIALECT_EVENTS, WATCHED_EVENTS, goes_hot, is_disconnect, wrapped

if TYPE_CHECKING:
    from app.adapters.db.models import Base

__all__ = [
    "HOT_DIALECTS", "WATCHED_DIALECT_EVENTS", "WATCHED_EVENTS", "HotCursor", "HotStatement", "HotTransaction",
    "bare", "engine_of", "goes_hot", "hot_transaction", "insert_new", "session_cursor", "session_insert_new",
]

Processor = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]
    positional: bool
    fixed: dict[str, Any]  # the values of the statement's own literals (anonymous binds)
    binds: tuple[Processor | None, ...]
    columns: tuple[TypeEngine[Any], ...]  # the result columns' types (the dialect's implementations)
    #: The result columns' processors by the type codes the DBAPI reports for them (a
    #: processor may depend on it: PostgreSQL's ``Numeric`` gives ``Decimal`` or ``float`` by OID).
    results: dict[tuple[Any, ...], tuple[Processor | None, ...]]

    def processors(self, description: Sequence[Sequence[Any]], dialect: Dialect) -> tuple[Processor | None, ...]:
        codes = tuple(d[1] for d in description)
        found = self.results.get(codes)
        if found is None:
            found = self.results.setdefault(codes, tuple(
                t.result_processor(dialect, code) for t, code in zip(self.columns, codes, strict=False)))
        return found


#: The databases the hot path runs on (the ones qoss supports and tests).
HOT_DIALECTS = frozenset({"sqlite", "postgresql"})
class HotStatement:
    """A Core statement (with named ``bindparam``s) compiled once per dialect (see the module).

    ``build`` gives the statement for a dialect name (``sqlite`` or ``postgresql``), so a
    statement may use a dialect's own constructs (``ON CONFLICT DO NOTHING``).
    """

    __slots__ = ("_build", "_built", "_by_dialect", "_lock")

    def __init__(self, build: Callable[[str], ClauseElement]) -> None:
        self._build = build
        self._by_dialect: dict[str, _Compiled] = {}
        self._built: dict[str, ClauseElement] = {}
        self._lock = threading.Lock()

    def statement(self, dialect: Dialect) -> ClauseElement:
        """The Core statement for ``dialect`` (built once; what the public path executes)."""
        found = self._built.get(dialect.name)
        if found is None:
            found = self._built.setdefault(dialect.name, self._build(dialect.name))
        return found

    def compiled(self, dialect: Dialect) -> _Compiled:
        found = self._by_dialect.get(dialect.name)
        if found is not None:
            return found
        if dialect.name not in HOT_DIALECTS:
            raise NotImplementedError(f"the hot path runs on SQLite and PostgreSQL, not {dialect.name}")
        with self._lock:
            found = self._by_dialect.get(dialect.name)
            if found is not None:  # another thread compiled it meanwhile
                return found
            statement = self.statement(dialect)
            compiled = cast(SQLCompiler, statement.compile(dialect=dialect))  # a statement: an SQLCompiler
            names = tuple(compiled.positiontup or ()) if dialect.positional else tuple(compiled.binds)
            binds = tuple(compiled.binds[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names)
            columns = getattr(statement, "exported_columns", ())  # SELECT's columns, or RETURNING's
            types = tuple(c.type.dialect_impl(dialect) for c in columns)
            fixed = {n: b.effective_value for n, b in compiled.binds.items() if not b.required}
            found = _Compiled(compiled.string, names, dialect.positional, fixed, binds, types, {})
            self._by_dialect[dialect.name] = found
        return found


class HotCursor:
    """Runs :class:`HotStatement` s on one DBAPI connection (inside a transaction someone else
    owns), or, given a SQLAlchemy ``connection`` instead, through ``Connection.execute`` (the
    public path: the same results, and errors with their parameters hidden alike)."""

    __slots__ = ("_connection", "_cursor", "dialect")

    def __init__(self, dbapi_connection: Any, dialect: Dialect, *, connection: Connection | None = None) -> None:
        self._connection = connection
        self._cursor: Any = dbapi_connection.cursor() if connection is None else None
        self.dialect = dialect

    def _execute(self, statement: HotStatement, params: Mapping[str, Any]) -> _Compiled:
        c = statement.compiled(self.dialect)
        if c.fixed:
            params = {**c.fixed, **params}
        values = [params[n] if p is None else p(params[n]) for n, p in zip(c.names, c.binds, strict=True)]
        try:
            self._cursor.execute(c.sql, values if c.positional else dict(zip(c.names, values, strict=True)))
        except self.dialect.loaded_dbapi.Error as exc:
            raise wrapped(c.sql, exc, self.dialect) from exc
        return c

    def _public(self, statement: HotStatement, params: Mapping[str, Any] | list[dict[str, Any]]) -> Any:
        assert self._connection is not None
        try:
            return self._connection.execute(cast(Executable, statement.statement(self.dialect)), params)
        except StatementError as exc:
            exc.hide_parameters = True  # as the hot path's errors: never the values
            raise

    def first(self, statement: HotStatement, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The first row (converted by the columns' types), or None; the rest is discarded."""
        if self._connection is not None:
            found = self._public(statement, dict(params)).first()
            return None if found is None else tuple(found)
        c = self._execute(statement, params)
        try:
            row = self._cursor.fetchone()
            description = self._cursor.description
            if description is not None:
                self._cursor.fetchall()  # psycopg: leave nothing pending on the cursor
        except self.dialect.loaded_dbapi.Error as exc:
            raise wrapped(c.sql, exc, self.dialect) from exc
        if row is None:
            return None
        processors = c.processors(description, self.dialect)
        return tuple(v if p is None else p(v) for v, p in zip(row, processors, strict=False))

    def all(self, statement: HotStatement, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Every row (converted by the columns' types)."""
        if self._connection is not None:
            return [tuple(r) for r in self._public(statement, dict(params))]
        c = self._execute(statement, params)
        try:
            rows = self._cursor.fetchall()
        except self.dialect.loaded_dbapi.Error as exc:
            raise wrapped(c.sql, exc, self.dialect) from exc
        if not rows:
            return []
        processors = c.processors(self._cursor.description, self.dialect)
        return [tuple(v if p is None else p(v) for v, p in zip(row, processors, strict=False)) for row in rows]

    def execute(self, statement: HotStatement, params: Mapping[str, Any]) -> int:
        """Run a statement that returns no rows; the row count."""
        if self._connection is not None:
            return int(self._public(statement, dict(params)).rowcount)
        self._execute(statement, params)
        return int(self._cursor.rowcount)

    def execute_many(self, statement: HotStatement, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement that returns no rows once per parameter set (the DBAPI's ``executemany``)."""
        if self._connection is not None:
            self._public(statement, [dict(r) for r in rows])
            return
        c = statement.compiled(self.dialect)
        values = []
        for params in rows:
            if c.fixed:
                params = {**c.fixed, **params}
            one = [params[n] if p is None else p(params[n]) for n, p in zip(c.names, c.binds, strict=True)]
            values.append(one if c.positional else dict(zip(c.names, one, strict=True)))
        try:
            self._cursor.executemany(c.sql, values)
        except self.dialect.loaded_dbapi.Error as exc:
            raise wrapped(c.sql, exc, self.dialect) from exc

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()


class HotTransaction:
    """A write transaction on a DBAPI connection checked out of the engine's pool (pre-ping and
    all), opened the way :func:`~app.adapters.db.engine.make_engine` opens one (``BEGIN
    IMMEDIATE`` on SQLite). End it with :meth:`commit` or :meth:`rollback`; :meth:`close`
    (always) rolls back what was not ended and gives the connection back, or drops it if an
    error showed it dead.

    Where the hot path steps aside (:func:`goes_hot`), the transaction is an engine
    ``Connection``'s own (its events, its invalidation of a dead connection).
    """

    __slots__ = ("_connection", "_dead", "_ended", "_gate", "_raw", "_transaction", "cursor", "dialect")

    def __init__(self, engine: Engine) -> None:
        self.dialect = dialect = engine.dialect
        self._dead = self._ended = False
        self._connection: Connection | None = None
        self._gate = write_gate.gate_of(engine)
        if not goes_hot(engine):
            self._connection = connection = engine.connect()
            try:
                self._transaction = connection.begin()
            except BaseException:
                connection.close()
                raise
            self.cursor = HotCursor(None, dialect, connection=connection)
            return
        try:
            self._raw = engine.raw_connection()
        except dialect.loaded_dbapi.Error as exc:  # raw_connection() leaves a failed connect unwrapped
            raise wrapped("connect", exc, dialect) from exc
        try:
            self.cursor = HotCursor(self._raw.driver_connection, dialect)
            if dialect.name == "sqlite":  # isolation_level None (make_engine): we open it, IMMEDIATE
                if self._gate is not None:
                    self._gate.enter(self._raw.info, timeout=30)
                self.cursor._cursor.execute("BEGIN IMMEDIATE")
        except dialect.loaded_dbapi.Error as exc:
            self._dead = is_disconnect(dialect, exc, self._raw)
            self._ended = True
            self.close()
            raise wrapped("BEGIN", exc, dialect) from exc

    def commit(self) -> None:
        """Commit (after a failed commit the transaction is rolled back).

        Raises:
            sqlalchemy.exc.DBAPIError: the commit failed.
        """
        if self._connection is not None:
            if not self._ended:
                self._ended = True
                self._transaction.commit()
            return
        self._end(self._raw.commit, "COMMIT")

    def rollback(self) -> None:
        """Roll back (a failure to is logged by the pool when the connection is dropped)."""
        if self._connection is not None:
            if not self._ended:
                self._ended = True
                self._transaction.rollback()
            return
        try:
            self._end(self._raw.rollback, "ROLLBACK")
        except DBAPIError:
            self._dead = True

    def _end(self, how: Callable[[], None], what: str) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            how()
            if self._gate is not None:
                self._gate.leave(self._raw.info)
        except self.dialect.loaded_dbapi.Error as exc:
            self._dead = is_disconnect(self.dialect, exc, self._raw)
            if what == "COMMIT" and not self._dead:
                self._ended = False
                self.rollback()
            raise wrapped(what, exc, self.dialect) from exc

    def abort(self, exc: BaseException) -> None:
        """Roll back after ``exc`` was raised inside the transaction: a DBAPI error that shows
        the connection dead keeps it out of the pool."""
        if self._connection is None:
            orig = exc.orig if isinstance(exc, DBAPIError) else None
            if orig is not None and is_disconnect(self.dialect, orig, self._raw):
                self._dead = True
        self.rollback()

    def close(self) -> None:
        """Roll back what was not ended; give the connection back (or drop a dead one)."""
        if self._connection is not None:
            self._connection.close()  # rolls back what was not ended
            return
        if not self._ended:
            self.rollback()
        try:
            if hasattr(self, "cursor"):
                self.cursor.close()
        except self.dialect.loaded_dbapi.Error:
            self._dead = True
        finally:
            if self._dead:
                self._raw.invalidate()
            self._raw.close()


@contextmanager
def hot_transaction(engine: Engine) -> Iterator[HotCursor]:
    """A :class:`HotTransaction` committed if the block ends normally, rolled back if it raises."""
    transaction = HotTransaction(engine)
    try:
        yield transaction.cursor
        transaction.commit()
    except BaseException as exc:
        transaction.abort(exc)
        raise
    finally:
        transaction.close()


@contextmanager
def session_cursor(session: Session) -> Iterator[HotCursor]:
    """A :class:`HotCursor` on the Session's connection: statements run in its transaction
    (begun if it was not); closed after the block. The public path where :func:`goes_hot` says so."""
    connection = session.connection()
    if goes_hot(connection):
        cursor = HotCursor(connection.connection.driver_connection, connection.dialect)
    else:
        cursor = HotCursor(None, connection.dialect, connection=connection)
    try:
        yield cursor
    finally:
        cursor.close()


def bare(session: Session) -> bool:
    """Whether ``session`` holds no ORM objects (loaded, new or deleted): a hot statement in its
    transaction then reads and writes exactly what the ORM's own statement would (no autoflush
    owed, no loaded object left stale)."""
    return not session.identity_map and not session.new and not session.deleted


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


#: ``INSERT ... ON CONFLICT DO NOTHING RETURNING key`` per (table, columns), as hot statements
#: (this module's): a claim costs one execution on the DBAPI cursor.
_INSERT_NEW: dict[tuple[str, tuple[str, ...]], HotStatement] = {}


def _insert_new_statement(core: Table, columns: tuple[str, ...]) -> HotStatement:
    found = _INSERT_NEW.get((core.name, columns))
    if found is None:
        key = next(iter(core.primary_key.columns))

        def build(dialect: str) -> Insert:
            insert_ = sqlite.insert if dialect == "sqlite" else postgresql.insert
            return insert_(core).values({k: bindparam(k) for k in columns}).on_conflict_do_nothing().returning(key)

        found = _INSERT_NEW.setdefault((core.name, columns), HotStatement(build))
    return found


def insert_new(cursor: HotCursor, table: type[Base], values: dict[str, Any]) -> bool:
    """``INSERT ... ON CONFLICT DO NOTHING``: True if the row was inserted, False if its key existed.

    One statement, no savepoint: the unique key makes it atomic across workers, and a
    conflict does not abort the surrounding transaction (SQLite >= 3.35 and PostgreSQL).
    RETURNING says whether a row went in (psycopg reports no rowcount for it).
    """
    statement = _insert_new_statement(cast(Table, table.__table__), tuple(values))
    return cursor.first(statement, values) is not None


def session_insert_new(session: Session, table: type[Base], values: dict[str, Any]) -> bool:
    """:func:`insert_new` in the Session's transaction."""
    with session_cursor(session) as cursor:
        return insert_new(cursor, table, values)
