"""Teardowns a peer did not hear are told again (``Peering.tell_again``), on a real SQLite
database, the peers reached through a scripted link: a peer that answers (an acknowledgement or
a refusal) has heard and its teardown is forgotten; one still silent is tried once per round
whatever it has due, its other teardowns put off with it; each try is a fresh message; a
teardown not heard for ``TELL_FOR`` seconds is given up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.adapters.agent.crypto import CRYPTO, KeyPair
from app.adapters.db.unit_of_work import sql_units_of_work
from app.adapters.peering import peering_keys
from app.domain.charon_port import ViciPort
from app.domain.errors import PeerUnreachable
from app.domain.peering import TELL_FOR, Peer, PeerState
from app.domain.policies import Levels
from app.domain.ports import UnitOfWorkFactory
from app.services.peering import Peering, PeeringConfig
from app.services.peering.service import TELL_ROUND_FOR
from tests.contract.databases import migrated_sessions

START = datetime(2026, 11, 29, 12, 0, tzinfo=UTC).timestamp()


class Link:
    """Peers by URL: ``silent`` ones never answer; the others refuse with a 404 (no such tunnel
    there: an answer all the same). Every message sent is kept; each takes ``takes`` seconds of
    ``clock`` (none without one)."""

    def __init__(self, silent: set[str], clock: Clock | None = None, takes: float = 0.0) -> None:
        self.silent = silent
        self.sent: list[tuple[str, bytes]] = []
        self.clock, self.takes = clock, takes

        #: What each peer answers instead of the 404 (a status), if anything.
        self.answers: dict[str, int] = {}

    def post(self, peer: str, url: str, data: bytes, timeout: float) -> tuple[int, bytes]:
        self.sent.append((peer, data))
        if self.clock is not None:
            self.clock.now += self.takes
        if peer in self.silent:
            raise PeerUnreachable(peer, f"{url} does not answer (ConnectError)")
        status = self.answers.get(peer, 404)
        return status, json.dumps({"detail": f"as a peer or its proxy answers {status}"}).encode()


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def units(tmp_path: Path) -> Iterator[UnitOfWorkFactory]:
    with migrated_sessions("sqlite", tmp_path) as sessions:
        factory = sql_units_of_work(sessions)
        with factory() as uow:
            for name in ("site-b", "site-c"):
                keys = KeyPair.generate(name).public
                uow.peers.create(Peer(name=name, url=f"http://{name}.test", sign_key=keys.sign, kem_key=keys.kem,
                                      gateways=(), networks=(), min_levels=Levels(), state=PeerState.ACTIVE))
            uow.commit()
        yield factory


def _peering(units: UnitOfWorkFactory, link: Link, clock: Clock) -> Peering:
    def no_charon(socket_path: str) -> ViciPort:
        raise AssertionError("telling a peer again touches no charon")
    return Peering(config=PeeringConfig(name="site-a", timeout=1.0, default_table="default"), units=units,
                   vici=no_charon, link=link, keys=peering_keys, crypto=CRYPTO, clock=clock)


def _kept(units: UnitOfWorkFactory) -> list[tuple[str, str, int]]:
    with units() as uow:
        return [(t.peer, t.tunnel_id, t.attempts) for t in uow.peers.unheard_due(datetime.max.replace(tzinfo=UTC), 100)]


def _peer(units: UnitOfWorkFactory, name: str) -> Peer:
    with units() as uow:
        return uow.peers.get(name)


def test_a_silent_peer_is_tried_once_a_round_and_one_that_answers_has_heard(units: UnitOfWorkFactory) -> None:
    link, clock = Link(silent={"site-b", "site-c"}), Clock()
    peering = _peering(units, link, clock)
    for tunnel in ("t1", "t2", "t3"):
        peering._tell(_peer(units, "site-b"), tunnel, "deleted by its administrator")
    peering._tell(_peer(units, "site-c"), "t4", "deleted by its administrator")
    assert len(link.sent) == 4  # each told once at once
    assert _kept(units) == [("site-b", "t1", 1), ("site-b", "t2", 1), ("site-b", "t3", 1), ("site-c", "t4", 1)]
    assert peering.tell_again() == 0  # none due yet
    assert len(link.sent) == 4

    clock.now += 2
    link.sent.clear()
    assert peering.tell_again() == 0
    assert [peer for peer, _ in link.sent] == ["site-b", "site-c"]  # one try for each silent peer
    assert sorted(_kept(units)) == [("site-b", "t1", 2), ("site-b", "t2", 2), ("site-b", "t3", 2), ("site-c", "t4", 2)]

    link.silent.discard("site-b")  # site-b answers again: all it had due is heard, site-c still silent
    clock.now += 4
    link.sent.clear()
    assert peering.tell_again() == 3
    assert sorted(peer for peer, _ in link.sent) == ["site-b", "site-b", "site-b", "site-c"]
    assert len({data for _, data in link.sent}) == 4  # a fresh message each time
    assert _kept(units) == [("site-c", "t4", 3)]


def test_a_teardown_not_heard_in_its_time_is_given_up(units: UnitOfWorkFactory) -> None:
    link, clock = Link(silent={"site-c"}), Clock()
    peering = _peering(units, link, clock)
    peering._tell(_peer(units, "site-c"), "t9", "the peering was revoked")
    clock.now += TELL_FOR - 1
    assert peering.tell_again() == 0
    assert _kept(units) == [("site-c", "t9", 2)]
    clock.now += 600
    assert peering.tell_again() == 0
    assert _kept(units) == []


def test_a_teardown_for_a_peer_no_longer_registered_is_dropped(units: UnitOfWorkFactory) -> None:
    link, clock = Link(silent=set()), Clock()
    peering = _peering(units, link, clock)
    keys = KeyPair.generate("site-z").public
    gone = Peer(name="site-z", url="http://site-z.test", sign_key=keys.sign, kem_key=keys.kem, gateways=(),
                networks=(), min_levels=Levels(), state=PeerState.ACTIVE)
    link.silent.add("site-z")
    peering._tell(gone, "t5", "deleted by its administrator")
    assert _kept(units) == [("site-z", "t5", 1)]
    clock.now += 2
    link.sent.clear()
    assert peering.tell_again() == 0
    assert link.sent == []
    assert _kept(units) == []


def test_a_round_sends_for_ten_seconds_at_most_and_leaves_the_rest_due(units: UnitOfWorkFactory) -> None:
    clock = Clock()
    link = Link(silent={"site-b"}, clock=clock)
    peering = _peering(units, link, clock)
    for tunnel in ("t1", "t2", "t3"):
        peering._tell(_peer(units, "site-b"), tunnel, "deleted by its administrator")
    link.silent.clear()
    link.takes = TELL_ROUND_FOR * 0.6  # a peer slow to answer, answering all the same
    clock.now += 2
    link.sent.clear()
    assert peering.tell_again() == 2  # the third would start past the round's time
    assert len(link.sent) == 2
    assert [t for _, t, _ in _kept(units)] == ["t3"]  # still due, as it was
    assert peering.tell_again() == 1
    assert _kept(units) == []


@pytest.mark.parametrize(("status", "heard"), [(404, True), (403, True), (422, True), (429, False), (500, False),
                                               (502, False), (503, False), (504, False)])
def test_a_refusal_is_heard_and_an_answer_to_try_later_is_not(units: UnitOfWorkFactory, status: int,
                                                               heard: bool) -> None:
    """A 4xx is the peer's own word on the teardown (no such tunnel, not from us); a 429 or a 5xx
    (the peer busy, or a proxy in front of a peer that is down) says nothing of it."""
    link, clock = Link(silent=set()), Clock()
    link.answers["site-b"] = status
    _peering(units, link, clock)._tell(_peer(units, "site-b"), "t1", "deleted by its administrator")
    assert _kept(units) == ([] if heard else [("site-b", "t1", 1)])
