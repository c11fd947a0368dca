"""Run the Alembic migrations programmatically (the only way the schema is made)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

__all__ = ["MIGRATIONS", "alembic_config", "current", "upgrade"]

MIGRATIONS = Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` pointing at the repository's ``migrations/``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The database's current migration revision."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
