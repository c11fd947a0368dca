"""The databases the contract tests run the SQL adapters on: a fresh one per test, migrated to
head (SQLite in the test's directory, or PostgreSQL on ``QOSS_TEST_PG_URL``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import upgrade
from tests.fixtures.db import postgres_database

__all__ = ["migrated_sessions"]


@contextmanager
def _sqlite(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'contract.db'}"
    upgrade(url)
    yield url


@contextmanager
def migrated_sessions(kind: str, tmp_path: Path, *, fast_paths: bool = True) -> Iterator[sessionmaker[Session]]:
    """Sessions on an empty database of ``kind`` (``sqlite`` or ``postgresql``), migrated to head;
    its engine disposed of afterwards. ``fast_paths=False``: hot statements take SQLAlchemy's
    public path (``QOSS_FAST_PATHS=false``)."""
    with postgres_database() if kind == "postgresql" else _sqlite(tmp_path) as url:
        engine = make_engine(url, fast_paths=fast_paths)
        try:
            yield make_session_factory(engine)
        finally:
            engine.dispose()
