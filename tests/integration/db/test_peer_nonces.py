"""A peer's message nonces: seen once, refused after, in the transaction of the caller; those past
their time are dropped, at most once per pruning interval. A peer's registration read through the
process's cache: kept, and forgotten by the repository's own writes when they commit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.models import PeerNonceRow, PeerRow
from app.adapters.db.repositories import PeerRepository
from app.adapters.db.repositories import peers as peers_module
from app.adapters.db.repositories.peers import PEER_CACHE, PeerCache
from app.domain.peering import Peer, PeerState
from app.domain.policies import Levels

_PEER = Peer(name="site-a", url="http://site-a.test", sign_key=b"s" * 32, kem_key=b"k" * 32, gateways=("gw",),
             networks=("10.0.0.0/8",), min_levels=Levels.from_dict(None))


def _nonces(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(PeerNonceRow)) or 0


@pytest.fixture
def registered(session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    with session_factory() as s, s.begin():
        PeerRepository(s).create(_PEER)
    return session_factory


def test_a_nonce_is_seen_once_and_then_refused_in_the_same_transaction(registered: sessionmaker[Session]) -> None:
    keep = datetime.now(UTC) + timedelta(seconds=60)
    with registered() as s, s.begin():
        peers = PeerRepository(s)
        assert peers.first_sight("site-a", "n" * 24, keep_until=keep)
        assert not peers.first_sight("site-a", "n" * 24, keep_until=keep)
        assert peers.first_sight("site-a", "m" * 24, keep_until=keep)  # the transaction goes on
    with registered() as s, s.begin():
        assert not PeerRepository(s).first_sight("site-a", "n" * 24, keep_until=keep)
        assert _nonces(s) == 2


def test_a_nonce_not_committed_is_not_kept(registered: sessionmaker[Session]) -> None:
    keep = datetime.now(UTC) + timedelta(seconds=60)
    with registered() as s:
        assert PeerRepository(s).first_sight("site-a", "n" * 24, keep_until=keep)
        s.rollback()
    with registered() as s, s.begin():
        assert PeerRepository(s).first_sight("site-a", "n" * 24, keep_until=keep)


def test_nonces_past_their_time_are_dropped_once_the_interval_has_passed(registered: sessionmaker[Session],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    later = datetime.now(UTC) + timedelta(seconds=60)
    monkeypatch.setattr(peers_module, "_next_prune", 0.0)
    with registered() as s, s.begin():
        PeerRepository(s).first_sight("site-a", "old" * 8, keep_until=past)  # prunes (nothing yet), then keeps it
        PeerRepository(s).first_sight("site-a", "new" * 8, keep_until=later)  # within the interval: no pruning
        assert _nonces(s) == 2
    monkeypatch.setattr(peers_module, "_next_prune", 0.0)  # the interval has passed
    with registered() as s, s.begin():
        PeerRepository(s).first_sight("site-a", "newer" * 5, keep_until=later)
        assert _nonces(s) == 2  # "old" dropped
        assert not PeerRepository(s).first_sight("site-a", "new" * 8, keep_until=later)


# --------------------------------------------------------------------------- the peers' read cache


Cached = tuple[sessionmaker[Session], sessionmaker[Session], PeerCache]


@pytest.fixture
def cached(registered: sessionmaker[Session], engine: Engine, database_url: str) -> Iterator[Cached]:
    """Writing and reading sessions sharing one peer cache (as a process's do)."""
    cache = PeerCache(ttl=60)
    reader = make_engine(database_url, writes=False)
    try:
        yield (make_session_factory(engine, info={PEER_CACHE: cache}),
               make_session_factory(reader, info={PEER_CACHE: cache}), cache)
    finally:
        reader.dispose()


def test_a_peer_read_is_kept_and_read_from_the_cache(cached: Cached) -> None:
    sessions, _, cache = cached
    with sessions() as s:
        first = PeerRepository(s).get("site-a")
    assert cache.fresh("site-a") == first
    with sessions() as s, s.begin():  # changed behind the repository's back
        s.execute(update(PeerRow).where(PeerRow.name == "site-a").values(url="http://elsewhere.test"))
    with sessions() as s:
        assert PeerRepository(s).get("site-a").url == "http://site-a.test"


def test_a_state_change_is_seen_by_the_next_read_once_committed(cached: Cached) -> None:
    sessions, reads, _ = cached
    with sessions() as writer:
        PeerRepository(writer).set_state("site-a", PeerState.REVOKED)
        with reads() as other:  # reads the committed row meanwhile, and keeps it
            assert PeerRepository(other).get("site-a").state is PeerState.ACTIVE
        writer.commit()
    with reads() as s:
        assert PeerRepository(s).get("site-a").state is PeerState.REVOKED
