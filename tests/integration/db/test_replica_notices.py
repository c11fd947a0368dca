"""Replicas on one PostgreSQL database keep each other's read caches true: a token revoked, a
gateway changed or a rating table edited by one process is forgotten by the others' caches at
once (NOTIFY in the change's transaction, LISTEN in each process); while a process cannot follow
the notices, its caches trust nothing. On SQLite nothing is sent or followed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.adapters import files
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.notices import NoticeListener
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.bootstrap import REPLICA_TTL, ReadCaches, read_caches
from app.domain.auth import Unauthenticated
from app.domain.tunnels import Gateway
from app.services import ratings
from app.services.auth import authenticate, create_token, revoke_token
from app.settings import SHIPPED_RATINGS_DIR, Settings
from tests.fixtures.db import postgres_database

GW = Gateway(name="left", vici_socket="/run/qoss/left.vici", ike_address="10.99.0.1", identity="left",
             inside_networks=("10.1.0.0/24",), backend="kernel-libipsec", version="5.9.8",
             algorithms=frozenset({"aes128gcm16"}))


def _within(seconds: float, done: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.02)
    return done()


class Replica:
    """One process's caches and sessions on the shared database."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self.caches: ReadCaches = read_caches(Settings(database_url=url))
        self.sessions: sessionmaker[Session] = make_session_factory(self.engine, info=self.caches.session_info())

    def unit(self) -> SqlUnitOfWork:
        return SqlUnitOfWork(self.sessions(), owned=True)

    def close(self) -> None:
        self.caches.close()
        self.engine.dispose()


@pytest.fixture
def replicas() -> Iterator[tuple[Replica, Replica]]:
    with postgres_database() as url:
        a, b = Replica(url), Replica(url)
        try:
            for r in (a, b):
                assert r.caches.notices is not None
                assert r.caches.notices.connected.wait(10), "the listener did not connect"
            yield a, b
        finally:
            a.close()
            b.close()


@pytest.mark.postgres
def test_a_change_on_one_replica_is_forgotten_by_the_others_cache_at_once(
        replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    assert (a.caches.tokens.ttl, a.caches.gateways.ttl, a.caches.tables.ttl) == (REPLICA_TTL,) * 3
    with a.unit() as uow:
        token, record = create_token(uow=uow, name="app", scopes=["tunnels:write"], expires_in=3600, created_by="t")
        uow.gateways.create(GW)
        ratings.load_shipped_tables(uow=uow, tables=[t for t in files.load_rating_tables(SHIPPED_RATINGS_DIR)
                                                     if t.name == "standards-2026"])
        uow.commit()
    with b.unit() as uow:  # b reads (and caches) the token, the gateway and a table
        assert authenticate(uow=uow, presented=token).name == "app"
        assert uow.gateways.get("left").version == "5.9.8"
        table = uow.tables.recent("standards-2026")
    assert b.caches.tokens.fresh(record.id) is not None
    assert b.caches.gateways.fresh("left") is not None
    assert b.caches.tables.fresh("standards-2026") is table
    with a.unit() as uow:  # a changes all three
        revoke_token(uow=uow, token_id=record.id)
        uow.gateways.update(Gateway(**{**GW.__dict__, "version": "6.0.0"}))
        ratings.update_rating(uow=uow, name="standards-2026", algorithm="aes128", changes={"reason": "edited"},
                              expected_revision=table.revision, author="a")
        uow.commit()
    assert _within(5, lambda: b.caches.tokens.fresh(record.id) is None and b.caches.gateways.fresh("left") is None
                   and b.caches.tables.fresh("standards-2026") is None)
    with b.unit() as uow, pytest.raises(Unauthenticated):
        authenticate(uow=uow, presented=token)
    with b.unit() as uow:
        assert uow.gateways.get("left").version == "6.0.0"
        assert uow.tables.recent("standards-2026").revision == table.revision + 1


@pytest.mark.postgres
def test_a_rolled_back_change_sends_nothing(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    with a.unit() as uow:
        uow.gateways.create(GW)
        uow.commit()
    with b.unit() as uow:
        uow.gateways.get("left")
    assert b.caches.notices is not None
    before = b.caches.notices.received
    with a.unit() as uow:
        uow.gateways.update(Gateway(**{**GW.__dict__, "version": "6.0.0"}))
        uow.rollback()
    with a.unit() as uow:  # a committed change after it: its notice is the next one b sees
        uow.gateways.update(Gateway(**{**GW.__dict__, "version": "7.0.0"}))
        uow.commit()
    assert _within(5, lambda: b.caches.notices is not None and b.caches.notices.received > before)
    assert b.caches.notices.received == before + 1


class _Cache:
    def __init__(self) -> None:
        self.ttl = 9.0
        self.cleared = 0
        self.forgotten: list[str] = []

    def forget(self, key: str) -> None:
        self.forgotten.append(key)

    def clear(self) -> None:
        self.cleared += 1


def test_without_the_notices_the_caches_trust_nothing() -> None:
    cache = _Cache()
    attempts: list[str] = []

    def unreachable(dsn: str) -> Any:
        attempts.append(dsn)
        raise OSError("connection refused")

    listener = NoticeListener("postgresql+psycopg://qoss@127.0.0.1:1/qoss", {"token": cache}, {"token": 30.0},
                              retry=0.05, connect=unreachable).start()
    try:
        assert _within(5, lambda: len(attempts) >= 3)  # it keeps trying
        assert cache.ttl == 0.0
        assert not listener.connected.is_set()
        assert attempts[0] == "postgresql://qoss@127.0.0.1:1/qoss"
    finally:
        listener.close()


def test_on_sqlite_nothing_is_followed(tmp_path: Any) -> None:
    caches = read_caches(Settings(database_url=f"sqlite:///{tmp_path}/q.db"))
    assert caches.notices is None
    assert (caches.tokens.ttl, caches.gateways.ttl, caches.tables.ttl) == (1.0, 1.0, 1.0)
    off = read_caches(Settings(database_url=f"sqlite:///{tmp_path}/q.db", token_cache_ttl=0))
    assert off.tokens.ttl == 0.0
