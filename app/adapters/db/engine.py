"""Engines and sessions for SQLite (embedded default) and PostgreSQL (production)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db import write_gate
from app.adapters.db.driver import FAST_PATHS_OPTION, begin_on

__all__ = ["FAST_PATHS_OPTION", "make_engine", "make_session_factory"]


def make_engine(url: str, *, writes: bool = True, fast_paths: bool = True, **kwargs: Any) -> Engine:
    """An engine for ``url``.

    SQLite: usable from any thread, foreign keys on, a 30 s busy timeout, WAL for file
    databases; with ``writes`` every transaction is opened with ``BEGIN IMMEDIATE`` so
    concurrent writers queue instead of failing on a stale read snapshot (optimistic
    concurrency then answers 409, never "database is locked"), and this process's writers
    queue on a lock of their own first (:mod:`app.adapters.db.write_gate`). A read-only engine
    (``writes=False``) keeps SQLite's deferred BEGIN, so readers never wait for each
    other or for writers (WAL). PostgreSQL: ``pool_pre_ping`` and a pool of 20 + 20.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:///./var/qoss.db`` or
            ``postgresql+psycopg://user@host/db``.
        writes: SQLite only: open transactions with ``BEGIN IMMEDIATE``.
        fast_paths: the ``fast_paths`` setting: False makes :mod:`app.adapters.db.hot` run its
            statements through SQLAlchemy's public execution path (an execution option of the engine).
        **kwargs: Passed on to :func:`sqlalchemy.create_engine`.

    Returns:
        The engine; dispose of it when done.
    """
    kwargs["execution_options"] = {**kwargs.get("execution_options", {}), FAST_PATHS_OPTION: fast_paths}
    if url.startswith("sqlite"):
        if ":memory:" not in url and url != "sqlite://":
            kwargs = {"pool_size": 20, "max_overflow": 40, **kwargs}
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _: Any) -> None:
            dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            if ":memory:" not in url:
                cursor.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL: commits are atomic and the file never corrupts; a power
                # loss may drop the last commits (SQLite's recommended setting for WAL).
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        database = engine.url.database
        if writes and database and database != ":memory:":
            write_gate.install(engine, database, timeout=30)  # before BEGIN IMMEDIATE, below

        begin = "BEGIN IMMEDIATE" if writes else "BEGIN"

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            begin_on(conn, begin)

        return engine
    return create_engine(url, **{"pool_pre_ping": True, "pool_size": 20, "max_overflow": 20, **kwargs})


def make_session_factory(engine: Engine, *, info: dict[str, Any] | None = None) -> sessionmaker[Session]:
    """A factory of sessions on ``engine``.

    Sessions never expire on commit, so values stay readable after the edge commits.

    Args:
        engine: From :func:`make_engine`.
        info: what every session's ``info`` holds (a process's shared caches).
    """
    return sessionmaker(engine, expire_on_commit=False, info=dict(info or {}))
