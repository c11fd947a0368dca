"""The process's gateway cache: a set-up or teardown reads a gateway from the database at most
once per ttl; this process's own changes are seen at once; with ttl 0 nothing is kept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import upgrade
from app.adapters.db.repositories.network import GATEWAY_CACHE, GatewayCache, GatewayRepository
from app.domain.errors import NotFound
from app.domain.tunnels import Gateway

GW = Gateway(name="left", vici_socket="/run/qoss/left.vici", ike_address="10.99.0.1", identity="left",
             inside_networks=("10.1.0.0/24",), backend="kernel-libipsec", version="5.9.8",
             algorithms=frozenset({"aes128gcm16"}))


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path: object) -> Iterator[tuple[sessionmaker[Session], GatewayCache, Clock, list[str]]]:
    url = f"sqlite:///{tmp_path}/q.db"
    upgrade(url)
    engine = make_engine(url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *a: statements.append(statement) if "gateways" in statement else None)
    clock = Clock()
    cache = GatewayCache(ttl=1.0, clock=clock)
    factory = make_session_factory(engine, info={GATEWAY_CACHE: cache})
    with factory() as s, s.begin():
        GatewayRepository(s).create(GW)
    statements.clear()
    yield factory, cache, clock, statements
    engine.dispose()


def test_a_gateway_is_read_once_per_ttl(setup: tuple[sessionmaker[Session], GatewayCache, Clock, list[str]]) -> None:
    factory, _, clock, statements = setup
    for _ in range(3):
        with factory() as s:
            assert GatewayRepository(s).get("left") == GW
            assert GatewayRepository(s).get_many(["left"]) == {"left": GW}
    assert len(statements) == 1
    clock.now += 1.5
    with factory() as s:
        assert GatewayRepository(s).get_many(["left"]) == {"left": GW}
    assert len(statements) == 2


def test_this_processs_changes_are_seen_at_once(
        setup: tuple[sessionmaker[Session], GatewayCache, Clock, list[str]]) -> None:
    factory, _, _, _ = setup
    with factory() as s:
        GatewayRepository(s).get("left")
    with factory() as s, s.begin():
        GatewayRepository(s).update(Gateway(**{**GW.__dict__, "version": "6.0.0"}))
    with factory() as s:
        assert GatewayRepository(s).get("left").version == "6.0.0"
    with factory() as s, s.begin():
        GatewayRepository(s).delete("left")
    with factory() as s, pytest.raises(NotFound):
        GatewayRepository(s).get_many(["left"])


def test_ttl_zero_keeps_nothing(setup: tuple[sessionmaker[Session], GatewayCache, Clock, list[str]]) -> None:
    factory, cache, _, statements = setup
    cache.ttl = 0.0
    for _ in range(3):
        with factory() as s:
            GatewayRepository(s).get("left")
    assert len(statements) == 3
