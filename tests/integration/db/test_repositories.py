"""Repositories and migrations against real SQLite and PostgreSQL (schema from Alembic only)."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.migrate import current
from app.adapters.db.models import Base, RatingTableRevisionRow
from app.adapters.db.repositories import PolicyRepository, RatingTableRepository
from app.domain.errors import AlreadyExists, NotFound, StaleRevision
from app.domain.policies import Policy
from app.domain.ratings import Rating, RatingTable

TABLE = RatingTable.of("t", [Rating("aes128", confidentiality=8, performance=8),
                             Rating("sha1", integrity=5, performance=6)])


def test_migrations_build_exactly_the_models(engine: Engine, database_url: str) -> None:
    assert current(database_url) is not None
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_create_get_list_delete(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        assert RatingTableRepository(s).create(TABLE, author="alice") == 1
    with session_factory() as s:
        repo = RatingTableRepository(s)
        assert repo.get("t").ratings == TABLE.ratings
        assert [t["name"] for t in repo.list()] == ["t"]
    with session_factory() as s, s.begin():
        RatingTableRepository(s).delete("t")
    with session_factory() as s, pytest.raises(NotFound):
        RatingTableRepository(s).get("t")


def test_duplicate_name_is_already_exists_and_writes_nothing(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
    with session_factory() as s, s.begin():
        with pytest.raises(AlreadyExists):
            RatingTableRepository(s).create(TABLE, author="bob")
        assert s.scalar(select(func.count()).select_from(RatingTableRevisionRow)) == 1


def test_update_makes_a_revision_with_author_and_changes(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
    edited = TABLE.with_rating(Rating("sha1", integrity=5, performance=7))
    with session_factory() as s, s.begin():
        assert RatingTableRepository(s).update(edited, expected_revision=1, author="bob", message="faster") == 2
    with session_factory() as s:
        repo = RatingTableRepository(s)
        history = repo.revisions("t")
        assert [(h["revision"], h["author"]) for h in history] == [(1, "alice"), (2, "bob")]
        assert history[1]["changes"] == [{"algorithm": "sha1", "field": "performance", "old": 6.0, "new": 7.0}]
        assert repo.get_revision("t", 1).ratings["sha1"].performance == 6
        assert repo.get("t").revision == 2


def test_stale_update_is_refused_and_writes_nothing(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
        RatingTableRepository(s).update(TABLE, expected_revision=1, author="alice")
    with session_factory() as s, s.begin(), pytest.raises(StaleRevision):
        RatingTableRepository(s).update(TABLE, expected_revision=1, author="bob")
    with session_factory() as s:
        assert RatingTableRepository(s).current_revision("t") == 2
        assert len(RatingTableRepository(s).revisions("t")) == 2


def test_twenty_concurrent_updates_exactly_one_wins(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
    barrier = threading.Barrier(20)
    outcomes: list[str] = []
    lock = threading.Lock()

    def edit(i: int) -> None:
        table = TABLE.with_rating(Rating("aes128", confidentiality=8, performance=1 + i / 10))
        barrier.wait(timeout=30)
        try:
            with session_factory() as s, s.begin():
                RatingTableRepository(s).update(table, expected_revision=1, author=f"w{i}")
            result = "won"
        except StaleRevision:
            result = "stale"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=edit, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["stale"] * 19 + ["won"]
    with session_factory() as s:
        assert RatingTableRepository(s).current_revision("t") == 2
        assert [h["revision"] for h in RatingTableRepository(s).revisions("t")] == [1, 2]


def test_policies_round_trip_with_revisions(session_factory: sessionmaker[Session]) -> None:
    policy = Policy.from_dict({"name": "p", "min_levels": {"integrity": 5}, "objective_id": 3})
    with session_factory() as s, s.begin():
        PolicyRepository(s).create(policy, author="alice")
        with pytest.raises(AlreadyExists):
            PolicyRepository(s).create(policy, author="alice")
    with session_factory() as s, s.begin():
        PolicyRepository(s).update(Policy.from_dict({"name": "p", "pfs": False}), expected_revision=1, author="b")
        with pytest.raises(StaleRevision):
            PolicyRepository(s).update(policy, expected_revision=1, author="c")
    with session_factory() as s:
        got, revision = PolicyRepository(s).get("p")
        assert revision == 2
        assert got.pfs is False
