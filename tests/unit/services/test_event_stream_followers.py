"""Who may follow the event stream, checked again at every look at the log, and how many
streams a process and one token may hold (on the in-memory unit of work)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.ratelimit import Overloaded
from app.domain.sessions import hash_session_id
from app.services.auth import create_token, revoke_token
from app.services.events import FollowerGone, StreamFollower, StreamSlots, TooManyStreams, stream_scopes
from app.services.ui_sessions import sign_in, sign_out
from tests.fakes.uow import FakeUnitOfWork

_HOUR = timedelta(hours=1)


def _token(uow: FakeUnitOfWork, scopes: list[str], expires_in: int | None = None) -> tuple[str, str]:
    token, record = create_token(uow=uow, name="ops", scopes=scopes, expires_in=expires_in, created_by="test",
                                 audit=False)
    return token, record.id


def test_a_tokens_follower_sees_its_scopes_until_the_token_is_revoked(uow: FakeUnitOfWork) -> None:
    _, token_id = _token(uow, ["tunnels:read"])
    follower = StreamFollower(token_id)
    assert stream_scopes(uow, follower) == frozenset({"tunnels:read"})
    revoke_token(uow=uow, token_id=token_id, audit=False)
    with pytest.raises(FollowerGone) as gone:
        stream_scopes(uow, follower)
    assert gone.value.reason == "the token was revoked"


def test_an_admin_follower_sees_every_scope_until_its_token_expires(uow: FakeUnitOfWork) -> None:
    _, token_id = _token(uow, ["admin"], expires_in=60)
    now = datetime.now(UTC)
    assert stream_scopes(uow, StreamFollower(token_id), now) is None
    with pytest.raises(FollowerGone) as gone:
        stream_scopes(uow, StreamFollower(token_id), now + timedelta(seconds=61))
    assert gone.value.reason == "the token has expired"


def test_a_console_follower_ends_with_its_session(uow: FakeUnitOfWork) -> None:
    token, token_id = _token(uow, ["audit:read"])
    now = datetime.now(UTC)
    session_id, _, _ = sign_in(uow=uow, presented=token, ttl=_HOUR, now=now)
    follower = StreamFollower(token_id, hash_session_id(session_id))
    assert stream_scopes(uow, follower, now) == frozenset({"audit:read"})
    with pytest.raises(FollowerGone) as expired:
        stream_scopes(uow, follower, now + _HOUR)
    assert expired.value.reason == "the console session has expired"
    sign_out(uow=uow, session_id=session_id)
    with pytest.raises(FollowerGone) as ended:
        stream_scopes(uow, follower, now)
    assert ended.value.reason == "the console session has ended"
    with pytest.raises(FollowerGone):  # another token's session follows nothing of this one
        stream_scopes(uow, StreamFollower("0123456789ab", hash_session_id(session_id)), now)


def test_a_token_holds_at_most_its_cap_of_streams_and_another_token_still_gets_one() -> None:
    slots = StreamSlots()
    limits = {"total": 10, "per_token": 2}
    held = [slots.take("aaaaaaaaaaaa", **limits) for _ in range(2)]
    with pytest.raises(TooManyStreams, match=r"max_event_streams_per_token = 2"):
        slots.take("aaaaaaaaaaaa", **limits)
    give_back = slots.take("bbbbbbbbbbbb", **limits)
    assert (len(slots), slots.held("aaaaaaaaaaaa")) == (3, 2)
    held[0]()
    held[0]()  # given back once, however often called
    assert (len(slots), slots.held("aaaaaaaaaaaa")) == (2, 1)
    slots.check("aaaaaaaaaaaa", **limits)
    give_back()
    held[1]()
    assert (len(slots), slots.held("aaaaaaaaaaaa"), slots.held("bbbbbbbbbbbb")) == (0, 0, 0)


def test_the_process_holds_at_most_its_total_of_streams() -> None:
    slots = StreamSlots()
    slots.take("aaaaaaaaaaaa", total=2, per_token=5)
    slots.take("bbbbbbbbbbbb", total=2, per_token=5)
    with pytest.raises(Overloaded):
        slots.take("cccccccccccc", total=2, per_token=5)
