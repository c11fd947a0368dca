"""The process's token cache: a request reads a token from the database at most once per ttl;
this process's revocations hold at once; expiry holds on every use; with ttl 0 nothing is kept.
And the read cache under it stays within its size."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import upgrade
from app.adapters.db.read_cache import ReadCache
from app.adapters.db.repositories.access import TOKEN_CACHE, TokenCache, TokenRepository
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.domain.auth import Unauthenticated
from app.services.auth import authenticate, create_token, revoke_token


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


Setup = tuple[sessionmaker[Session], TokenCache, Clock, list[str], str, str]


@pytest.fixture
def setup(tmp_path: object) -> Iterator[Setup]:
    url = f"sqlite:///{tmp_path}/q.db"
    upgrade(url)
    engine = make_engine(url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *a: statements.append(statement) if "api_tokens" in statement
                 else None)
    clock = Clock()
    cache = TokenCache(ttl=1.0, clock=clock)
    factory = make_session_factory(engine, info={TOKEN_CACHE: cache})
    with SqlUnitOfWork(factory(), owned=True) as uow:
        token, record = create_token(uow=uow, name="app", scopes=["tunnels:write"], expires_in=3600,
                                     created_by="test")
        uow.commit()
    statements.clear()
    yield factory, cache, clock, statements, token, record.id
    engine.dispose()


def _check(factory: sessionmaker[Session], token: str) -> str:
    with SqlUnitOfWork(factory(), owned=True) as uow:
        return authenticate(uow=uow, presented=token).name


def test_a_token_is_read_once_per_ttl_and_its_secret_checked_every_time(setup: Setup) -> None:
    factory, _, clock, statements, token, _ = setup
    for _ in range(3):
        assert _check(factory, token) == "app"
    assert len(statements) == 1
    with pytest.raises(Unauthenticated):  # a cached token with another secret is still refused
        _check(factory, token[:-4] + "AAAA")
    clock.now += 1.5
    assert _check(factory, token) == "app"
    assert len(statements) == 2


def test_a_revocation_here_holds_at_once(setup: Setup) -> None:
    factory, _, _, _, token, token_id = setup
    assert _check(factory, token) == "app"
    with SqlUnitOfWork(factory(), owned=True) as uow:
        revoke_token(uow=uow, token_id=token_id)
        uow.commit()
    with pytest.raises(Unauthenticated):
        _check(factory, token)


def test_an_expired_token_is_refused_though_cached(setup: Setup) -> None:
    factory, cache, _, _, token, token_id = setup
    assert _check(factory, token) == "app"
    record = cache.fresh(token_id)
    assert record is not None
    cache.keep(token_id, type(record)(**{**record.__dict__, "expires_at": datetime.now(UTC) - timedelta(seconds=1)}))
    with pytest.raises(Unauthenticated):
        _check(factory, token)


def test_ttl_zero_keeps_nothing(setup: Setup) -> None:
    factory, cache, _, statements, token, _ = setup
    cache.ttl = 0.0
    for _ in range(3):
        _check(factory, token)
    assert len(statements) == 3
    with factory() as s:
        assert TokenRepository(s).find("000000000000") is None


def test_the_read_cache_drops_the_oldest_past_its_size() -> None:
    cache: ReadCache[str, int] = ReadCache(ttl=60, max_entries=3)
    for i in range(5):
        cache.keep(str(i), i)
    assert [cache.fresh(str(i)) for i in range(5)] == [None, None, 2, 3, 4]
    cache.keep("2", 20)  # read again: now the newest
    cache.keep("5", 5)
    assert [cache.fresh(k) for k in ("2", "3", "4", "5")] == [20, None, 4, 5]
