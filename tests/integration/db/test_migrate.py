"""The Alembic migrations, on real SQLite and PostgreSQL: they build exactly the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect, pool

from app.adapters.db.migrate import alembic_config, current, downgrade, upgrade
from app.adapters.db.models import Base


def _schema_diff(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


def _head() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def test_migrations_reach_head(database_url: str) -> None:
    assert current(database_url) == _head()


def test_migrated_schema_equals_the_models(engine: Engine) -> None:
    assert _schema_diff(engine) == []


def test_upgrade_twice_changes_nothing(database_url: str, engine: Engine) -> None:
    upgrade(database_url)
    assert current(database_url) == _head()
    assert _schema_diff(engine) == []


def test_downgrade_to_base_then_upgrade_rebuilds_the_schema(database_url: str) -> None:
    downgrade(database_url, "base")
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        assert current(database_url) is None
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(database_url)
        assert set(inspect(engine).get_table_names()) >= set(Base.metadata.tables)
        assert _schema_diff(engine) == []
    finally:
        engine.dispose()
