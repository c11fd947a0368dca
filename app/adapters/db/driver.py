"""When SQLAlchemy's execution layer may be skipped, and the DBAPI's errors as SQLAlchemy's.

Statements run on the DBAPI connection (:mod:`app.adapters.db.hot`) and SQLite's ``BEGIN
IMMEDIATE`` (:func:`begin_on`, the ``begin`` listener of
:func:`~app.adapters.db.engine.make_engine`) step aside for SQLAlchemy's own execution where
:func:`goes_hot` says so: the ``fast_paths`` setting is off for the engine, or a listener that
must see every statement is registered, or ``echo`` is on. What of SQLAlchemy this relies on
beyond its public API (the dispatch of those events, ``DBAPIError.instance``, the dialect's
``loaded_dbapi`` and ``is_disconnect``) is checked by ``tests/unit/adapters/test_hot_library_shape.py``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError

__all__ = ["FAST_PATHS_OPTION", "WATCHED_DIALECT_EVENTS", "WATCHED_EVENTS", "begin_on", "goes_hot", "is_disconnect",
           "wrapped"]

#: The engine execution option that carries the ``fast_paths`` setting.
FAST_PATHS_OPTION = "qoss_fast_paths"

#: Engine events whose listeners must see what the hot path would run unseen: with one
#: registered, statements go through ``Connection.execute`` (``begin`` is not among them:
#: :func:`~app.adapters.db.engine.make_engine` listens to it on SQLite, and the hot path
#: opens its transactions the way that listener does).
WATCHED_EVENTS = ("before_execute", "after_execute", "before_cursor_execute", "after_cursor_execute", "commit",
                  "rollback")
#: The same for the engine's dialect events (``handle_error`` and the ``do_execute`` hooks).
WATCHED_DIALECT_EVENTS = ("handle_error", "do_execute", "do_execute_no_params", "do_executemany")


def goes_hot(bind: Engine | Connection) -> bool:
    """Whether statements on ``bind`` take the hot path: the fast paths are on for it, no listener
    of :data:`WATCHED_EVENTS` or :data:`WATCHED_DIALECT_EVENTS` is registered (on the engine or
    the connection), ``echo`` is off."""
    if not bind.get_execution_options().get(FAST_PATHS_OPTION, True) or bind.engine.echo:
        return False
    dispatch, dialect = bind.dispatch, bind.dialect.dispatch
    return not (any(getattr(dispatch, name) for name in WATCHED_EVENTS)
                or any(getattr(dialect, name) for name in WATCHED_DIALECT_EVENTS))


def wrapped(sql: str, exc: Exception, dialect: Dialect) -> StatementError:
    """A DBAPI error as SQLAlchemy's (``IntegrityError``, ``OperationalError``...), its parameters hidden."""
    return DBAPIError.instance(sql, None, exc, dialect.loaded_dbapi.Error, hide_parameters=True, dialect=dialect)


def is_disconnect(dialect: Dialect, exc: BaseException, raw: Any) -> bool:
    """Whether ``exc`` shows the DBAPI connection of pool record ``raw`` dead."""
    return isinstance(exc, dialect.loaded_dbapi.Error) and bool(dialect.is_disconnect(exc, raw.driver_connection, None))


def begin_on(connection: Connection, sql: str) -> None:
    """Open ``connection``'s transaction with ``sql`` (``BEGIN IMMEDIATE`` on SQLite: the engine's
    ``begin`` listener): on its DBAPI connection, or through ``exec_driver_sql`` where the hot
    path steps aside (:func:`goes_hot`), so that listeners of statements see it. Errors are
    SQLAlchemy's either way."""
    if not goes_hot(connection):
        connection.exec_driver_sql(sql)
        return
    dialect = connection.dialect
    try:
        connection.connection.driver_connection.execute(sql)  # type: ignore[union-attr]
    except dialect.loaded_dbapi.Error as exc:
        if is_disconnect(dialect, exc, connection.connection):
            connection.invalidate(exc)
        raise wrapped(sql, exc, dialect) from exc
