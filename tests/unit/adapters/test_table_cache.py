"""The process's rating-table cache, behind the repository: a negotiation reads a table's revision at
most once per ttl; the repository's own writes are seen at once (and an uncommitted one only by its
own session); another writer's within the ttl."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.adapters import files
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import upgrade
from app.adapters.db.repositories.revisioned import TABLE_CACHE, RatingTableRepository, TableCache
from app.domain.ratings import Rating, RatingTable
from app.settings import SHIPPED_RATINGS_DIR

NAME = "standards-2026"
ROW = "aes128gcm16"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Setup:
    cached: sessionmaker[Session]  # this process: its sessions share the cache
    reads: sessionmaker[Session]  # this process's read-only sessions (SQLite: beside an open write)
    other: sessionmaker[Session]  # another replica: no cache of ours
    cache: TableCache
    clock: Clock


def _setup(url: str, ttl: float) -> tuple[Setup, list[Engine]]:
    upgrade(url)
    engine, read_engine = make_engine(url), make_engine(url, writes=False)
    clock = Clock()
    cache = TableCache(ttl=ttl, clock=clock)
    other = make_session_factory(engine)
    table = next(t for t in files.load_rating_tables(SHIPPED_RATINGS_DIR) if t.name == NAME)
    with other() as s, s.begin():
        RatingTableRepository(s).create(table, author="test")
    made = Setup(make_session_factory(engine, info={TABLE_CACHE: cache}),
                 make_session_factory(read_engine, info={TABLE_CACHE: cache}), other, cache, clock)
    return made, [engine, read_engine]


@pytest.fixture
def setup(tmp_path: object) -> Iterator[Setup]:
    made, engines = _setup(f"sqlite:///{tmp_path}/q.db", ttl=1.0)
    yield made
    for engine in engines:
        engine.dispose()


def recent(factory: sessionmaker[Session], **kw: bool) -> RatingTable:
    with factory() as s:
        return RatingTableRepository(s).recent(NAME, **kw)


def edit(session: Session, performance: float) -> int:
    repo = RatingTableRepository(session)
    table = repo.get(NAME)
    row = table.ratings[ROW]
    changed = table.with_rating(Rating.from_dict({**row.as_dict(), "performance": performance}, "row"))
    return repo.update(changed, expected_revision=table.revision, author="test")


def test_one_revision_is_one_object_read_once_per_ttl(setup: Setup) -> None:
    first = recent(setup.cached)
    assert first.revision == 1
    assert recent(setup.cached) is first
    setup.clock.now += 5  # past the ttl: the revision is read again, unchanged, so the table is kept
    assert recent(setup.cached) is first
    assert recent(setup.cached, check=True) is first


def test_another_writer_is_seen_once_the_ttl_has_passed(setup: Setup) -> None:
    first = recent(setup.cached)
    with setup.other() as s, s.begin():
        edit(s, 0.5)
    assert recent(setup.cached) is first  # trusted within the ttl
    assert recent(setup.cached, check=True).revision == 2  # unless asked to read the revision now
    with setup.other() as s, s.begin():
        edit(s, 0.6)
    setup.clock.now += 1.5
    assert recent(setup.cached).revision == 3


def test_this_process_edit_is_seen_at_once(setup: Setup) -> None:
    recent(setup.cached)
    with setup.cached() as s, s.begin():
        assert edit(s, 0.5) == 2
    assert recent(setup.cached).revision == 2
    with setup.cached() as s, s.begin():
        RatingTableRepository(s).delete(NAME)
    with pytest.raises(Exception, match="does not exist"):
        recent(setup.cached)


def test_an_uncommitted_edit_is_read_by_its_own_session_and_lent_to_no_other(setup: Setup) -> None:
    recent(setup.cached)
    with setup.cached() as s:
        s.begin()
        edit(s, 0.5)
        mine = RatingTableRepository(s).recent(NAME)
        assert (mine.revision, mine.ratings[ROW].performance) == (2, 0.5)
        s.rollback()
    assert recent(setup.cached).revision == 1
    assert recent(setup.cached, check=True).revision == 1


def test_a_read_between_an_edit_and_its_commit_is_forgotten_when_it_commits(setup: Setup) -> None:
    with setup.cached() as writer:
        writer.begin()
        edit(writer, 0.5)
        assert recent(setup.reads).revision == 1  # another session, before the commit
        writer.commit()
    assert recent(setup.cached).revision == 2  # within the ttl of that read


def test_with_ttl_0_every_read_checks_the_revision_and_keeps_the_table(tmp_path: object) -> None:
    made, engines = _setup(f"sqlite:///{tmp_path}/q.db", ttl=0.0)
    try:
        first = recent(made.cached)
        assert recent(made.cached) is first
        with made.other() as s, s.begin():
            edit(s, 0.5)
        assert recent(made.cached).revision == 2
    finally:
        for engine in engines:
            engine.dispose()


def test_memo_reuses_a_value_made_from_the_same_tables_until_one_changes(setup: Setup) -> None:
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    with setup.cached() as s:
        repo = RatingTableRepository(s)
        table = repo.recent(NAME)
        assert repo.memo("k", [table], make) == 1
        assert repo.memo("k", [table], make) == 1
        assert repo.memo("other", [table], make) == 2
    with setup.cached() as s, s.begin():
        edit(s, 0.5)
    with setup.cached() as s:
        repo = RatingTableRepository(s)
        assert repo.memo("k", [repo.recent(NAME)], make) == 3


def test_memo_keeps_nothing_for_a_session_that_changed_a_table(setup: Setup) -> None:
    with setup.cached() as s:
        s.begin()
        edit(s, 0.5)
        repo = RatingTableRepository(s)
        table = repo.recent(NAME)
        assert repo.memo("k", [table], lambda: object()) is not repo.memo("k", [table], lambda: object())
        s.rollback()


def test_memo_keeps_only_the_most_recent_values() -> None:
    cache = TableCache(results=2)
    table = RatingTable(name="t", ratings={})
    for i in range(3):
        cache.memo(i, [table], lambda i=i: i)  # type: ignore[misc]
    assert cache.memo(0, [table], lambda: -1) == -1
    assert cache.memo(2, [table], lambda: -1) == 2


def test_memo_keeps_nothing_when_making_fails() -> None:
    cache = TableCache()
    table = RatingTable(name="t", ratings={})

    def fail() -> int:
        raise ValueError("refused")

    for _ in range(2):
        with pytest.raises(ValueError, match="refused"):
            cache.memo("k", [table], fail)
    assert cache.memo("k", [table], lambda: 1) == 1
