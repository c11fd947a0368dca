"""Console sessions of the identity provider's users, on every store: kept with no token, their
subject, name, scopes and mapping fingerprint read back as written, and a row of neither kind
refused by the SQL stores' check."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from app.adapters.db.unit_of_work import sql_units_of_work
from app.domain.ports import UnitOfWork, UnitOfWorkFactory
from app.domain.sessions import SessionRecord
from tests.contract.databases import migrated_sessions
from tests.fakes.uow import FakeDatabase

Units = Callable[[], UnitOfWork]


@pytest.fixture(params=["fake", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def units(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitOfWorkFactory]:
    if request.param == "fake":
        yield FakeDatabase().unit
        return
    with migrated_sessions(request.param, tmp_path) as sessions:
        yield sql_units_of_work(sessions)


def _user_session(now: datetime) -> SessionRecord:
    return SessionRecord(id_hash="d" * 64, token_id=None, created_at=now, expires_at=now + timedelta(hours=1),
                         subject="248289761001", user_name="alice@example.com",
                         scopes=frozenset({"ratings:write", "tunnels:read"}), mapping_hash="f" * 64)


def test_a_users_session_is_kept_without_a_token_and_read_back_whole(units: Units) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    with units() as uow:
        uow.sessions.add(_user_session(now))
        uow.commit()
    with units() as uow:
        found = uow.sessions.find("d" * 64)
        assert found == _user_session(now)
        assert found is not None and found.holder == "oidc:248289761001"  # noqa: PT018
        assert uow.sessions.delete_ended(now + timedelta(hours=2)) == 1
        uow.commit()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_database_refuses_a_session_of_neither_kind(kind: str, tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    with migrated_sessions(kind, tmp_path) as sessions, sql_units_of_work(sessions)() as uow, \
            pytest.raises(IntegrityError):
        uow.sessions.add(replace(_user_session(now), mapping_hash=None))
