"""Run the Alembic migrations programmatically: the only way the schema is made.

The migrations travel inside the package (``app/migrations``, :data:`app.resources.MIGRATIONS_DIR`);
the database URL is passed in, never read from ``alembic.ini``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from app.resources import MIGRATIONS_DIR

__all__ = ["MIGRATIONS", "alembic_config", "current", "downgrade", "is_at_head", "upgrade"]

#: The migrations' directory.
MIGRATIONS = MIGRATIONS_DIR


def alembic_config(url: str) -> Config:
    """An Alembic configuration for ``url``.

    Args:
        url: SQLAlchemy database URL; ``migrations/env.py`` reads it from
            ``config.attributes["url"]``.

    Returns:
        A configuration whose ``script_location`` is :data:`MIGRATIONS`.
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``.

    Args:
        url: SQLAlchemy database URL.
        revision: Alembic revision to reach, ``"head"`` by default.
    """
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"``: empty).

    Args:
        url: SQLAlchemy database URL.
        revision: Alembic revision to reach.
    """
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The database's current migration revision.

    Args:
        url: SQLAlchemy database URL.

    Returns:
        The revision id, None for a database that was never migrated.
    """
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def is_at_head(url: str) -> bool:
    """Whether the database at ``url`` exists and is migrated to the newest revision.

    A SQLite file that does not exist is not created by asking.
    """
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:" and not Path(path).exists():
            return False
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    return current(url) == head
