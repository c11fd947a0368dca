"""The teardowns a peer did not hear (``PeerStore.keep_unheard``, ``unheard_due``, ``heard``) on
SQLite and PostgreSQL: kept one per tunnel and peer, found when due, longest due first, and
forgotten; and the domain's rule for the next try."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.adapters.db.unit_of_work import sql_units_of_work
from app.domain.peering import TELL_EVERY_AT_MOST, TELL_FOR, UnheardTeardown
from app.domain.ports import UnitOfWorkFactory
from tests.contract.databases import migrated_sessions

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def units(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitOfWorkFactory]:
    with migrated_sessions(request.param, tmp_path) as sessions:
        yield sql_units_of_work(sessions)


def _unheard(peer: str, tunnel_id: str, due_in: float, attempts: int = 1) -> UnheardTeardown:
    return UnheardTeardown(peer=peer, tunnel_id=tunnel_id, reason="deleted by its administrator", first_at=NOW,
                           attempts=attempts, next_at=NOW + timedelta(seconds=due_in))


def test_unheard_teardowns_are_kept_one_per_tunnel_found_when_due_and_forgotten(units: UnitOfWorkFactory) -> None:
    with units() as uow:
        uow.peers.keep_unheard(_unheard("site-b", "t1", 5))
        uow.peers.keep_unheard(_unheard("site-b", "t2", -10))
        uow.peers.keep_unheard(_unheard("site-c", "t1", -20))  # the same tunnel id with another peer
        uow.peers.keep_unheard(_unheard("site-b", "t3", 60))
        uow.commit()
    with units() as uow:
        due = uow.peers.unheard_due(NOW, 10)
        assert [(t.peer, t.tunnel_id) for t in due] == [("site-c", "t1"), ("site-b", "t2")]  # longest due first
        assert due[1] == _unheard("site-b", "t2", -10)  # as kept
        assert [t.tunnel_id for t in uow.peers.unheard_due(NOW + timedelta(seconds=5), 10)] == ["t1", "t2", "t1"]
        assert len(uow.peers.unheard_due(NOW + timedelta(seconds=60), 2)) == 2  # at most the limit
    with units() as uow:  # told again and not heard: replaced, not added
        uow.peers.keep_unheard(_unheard("site-b", "t2", 30, attempts=3))
        uow.peers.heard("site-c", "t1")
        uow.peers.heard("site-c", "nothing-kept")
        uow.commit()
    with units() as uow:
        later = uow.peers.unheard_due(NOW + timedelta(seconds=60), 10)
        assert [(t.peer, t.tunnel_id, t.attempts) for t in later] == [
            ("site-b", "t1", 1), ("site-b", "t2", 3), ("site-b", "t3", 1)]
        assert uow.peers.unheard_due(NOW, 10) == []


def test_a_teardown_not_heard_is_told_again_ever_later_until_its_time_is_up() -> None:
    first = _unheard("site-b", "t1", 2)
    second = first.again(NOW + timedelta(seconds=2))
    assert second is not None
    assert (second.attempts, second.next_at) == (2, NOW + timedelta(seconds=6))  # 2 s after the first, then 4 s
    much_later = UnheardTeardown("site-b", "t1", "x", NOW, 20, NOW)
    again = much_later.again(NOW + timedelta(hours=1))
    assert again is not None
    assert again.next_at == NOW + timedelta(hours=1, seconds=TELL_EVERY_AT_MOST)  # never further off than that
    assert first.again(NOW + timedelta(seconds=TELL_FOR)) is None  # given up
