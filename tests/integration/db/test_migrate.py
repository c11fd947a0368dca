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


def test_policy_revisions_written_before_0008_get_their_changes(database_url: str) -> None:
    from datetime import UTC, datetime

    from sqlalchemy import text

    downgrade(database_url, "0007")
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        first = '{"name": "p", "description": "one", "min_levels": {"confidentiality": 5}}'
        second = '{"name": "p", "description": "two", "min_levels": {"confidentiality": 5}}'
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO policies (id, name, current_revision, created_at, updated_at) "
                              "VALUES (1, 'p', 2, :t, :t)"), {"t": datetime.now(UTC)})
            for revision, content in ((1, first), (2, second)):
                conn.execute(text("INSERT INTO policy_revisions (policy_id, revision, author, message, created_at, "
                                  "content) VALUES (1, :r, 'a', '', :t, :c)"),
                             {"r": revision, "t": datetime.now(UTC), "c": content})
        upgrade(database_url)
        from app.adapters.db.engine import make_session_factory
        from app.adapters.db.repositories import PolicyRepository

        with make_session_factory(engine)() as session:
            history = PolicyRepository(session).revisions("p")
        assert [h["changes"] for h in history] == [[], [{"field": "description", "old": "one", "new": "two"}]]
        downgrade(database_url, "0007")
        assert "changes" not in {c["name"] for c in inspect(engine).get_columns("policy_revisions")}
    finally:
        engine.dispose()
