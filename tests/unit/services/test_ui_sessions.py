"""Console sessions on the in-memory unit of work: a session lives only as long as its token."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.auth import Unauthenticated
from app.domain.sessions import csrf_matches, csrf_token, hash_session_id
from app.services.auth import create_token, revoke_token
from app.services.ui_sessions import resolve, sign_in, sign_out
from tests.fakes.uow import FakeUnitOfWork

_HOUR = timedelta(hours=1)


def _token(uow: FakeUnitOfWork, expires_in: int | None = None) -> str:
    token, _ = create_token(uow=uow, name="ops", scopes=["ratings:write"], expires_in=expires_in,
                            created_by="test", audit=False)
    return token


def test_a_signed_in_session_resolves_to_its_token_and_stores_only_a_hash(uow: FakeUnitOfWork) -> None:
    session_id, record, token = sign_in(uow=uow, presented=_token(uow), ttl=_HOUR)
    assert record.id_hash == hash_session_id(session_id) != session_id
    assert session_id not in repr(uow.read().sessions)
    assert resolve(uow=uow, session_id=session_id) == (record, token)


def test_a_bad_token_opens_no_session(uow: FakeUnitOfWork) -> None:
    with pytest.raises(Unauthenticated):
        sign_in(uow=uow, presented="qoss_0123456789ab_" + "x" * 43, ttl=_HOUR)
    assert not uow.read().sessions


def test_a_session_ends_when_its_token_is_revoked(uow: FakeUnitOfWork) -> None:
    session_id, _, token = sign_in(uow=uow, presented=_token(uow), ttl=_HOUR)
    revoke_token(uow=uow, token_id=token.id, audit=False)
    with pytest.raises(Unauthenticated):
        resolve(uow=uow, session_id=session_id)


def test_a_session_ends_with_its_ttl_and_never_after_its_token(uow: FakeUnitOfWork) -> None:
    now = datetime.now(UTC)
    session_id, record, _ = sign_in(uow=uow, presented=_token(uow, expires_in=600), ttl=_HOUR, now=now)
    assert record.expires_at <= now + timedelta(seconds=601)
    resolve(uow=uow, session_id=session_id, now=now + timedelta(seconds=590))
    with pytest.raises(Unauthenticated):
        resolve(uow=uow, session_id=session_id, now=now + timedelta(seconds=601))
    other, _, _ = sign_in(uow=uow, presented=_token(uow), ttl=_HOUR, now=now)
    with pytest.raises(Unauthenticated):
        resolve(uow=uow, session_id=other, now=now + _HOUR)


def test_sign_out_ends_the_session_and_sign_in_forgets_ended_ones(uow: FakeUnitOfWork) -> None:
    now = datetime.now(UTC)
    old, _, _ = sign_in(uow=uow, presented=_token(uow), ttl=_HOUR, now=now - 2 * _HOUR)
    session_id, _, _ = sign_in(uow=uow, presented=_token(uow), ttl=_HOUR, now=now)
    assert hash_session_id(old) not in uow.read().sessions
    sign_out(uow=uow, session_id=session_id)
    sign_out(uow=uow, session_id=session_id)
    with pytest.raises(Unauthenticated):
        resolve(uow=uow, session_id=session_id)


@pytest.mark.parametrize("session_id", [None, "", "x" * 129, "unknown"])
def test_no_or_an_unknown_session_id_is_unauthenticated(uow: FakeUnitOfWork, session_id: str | None) -> None:
    with pytest.raises(Unauthenticated):
        resolve(uow=uow, session_id=session_id)


def test_the_csrf_token_is_bound_to_the_session() -> None:
    assert csrf_matches("one", csrf_token("one"))
    assert not csrf_matches("two", csrf_token("one"))
    assert not csrf_matches("one", None)
    assert not csrf_matches("one", "")
