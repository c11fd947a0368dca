"""Run the Alembic migrations programmatically: the only way the schema is made.

The migrations (``migrations/``, inside the wheel ``app/_shipped/migrations``: :data:`app.settings.MIGRATIONS_DIR`);
the database URL is passed in, never read from ``alembic.ini``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import make_url

from app.settings import MIGRATIONS_DIR

__all__ = ["MIGRATIONS", "SchemaState", "alembic_config", "current", "downgrade", "schema_state",
           "sqlite_path", "upgrade"]

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


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for other databases and in-memory SQLite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


@dataclass(frozen=True, slots=True)
class SchemaState:
    """Where a database stands against this version's migrations.

    ``kind``: ``missing`` (a SQLite file that does not exist), ``empty`` (never migrated),
    ``behind`` (an older revision: ``qoss db upgrade`` brings it forward), ``unknown`` (a
    revision these migrations do not know, e.g. written by a newer version), ``current``.
    """

    kind: Literal["missing", "empty", "behind", "unknown", "current"]
    revision: str | None
    head: str


def schema_state(url: str) -> SchemaState:
    """Where the database at ``url`` stands; reads only: a SQLite file is never created by asking.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or read.
    """
    script = ScriptDirectory.from_config(alembic_config(url))
    head = script.get_current_head()
    assert head is not None  # the package ships its migrations
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return SchemaState("missing", None, head)
    revision = current(url)
    if revision is None:
        return SchemaState("empty", None, head)
    if revision == head:
        return SchemaState("current", revision, head)
    known = {r.revision for r in script.walk_revisions()}
    return SchemaState("behind" if revision in known else "unknown", revision, head)
