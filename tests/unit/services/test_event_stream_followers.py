"""Who may follow the event stream, checked again at every look at the log, and how many
streams a process and one token may hold (on the in-memory unit of work)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.ratelimit import Overloaded
from app.domain.sessions import hash_session_id
from app.services.auth import create_token, revoke_token
from app.services.events import FollowerGone, StreamFollower, StreamSlots, TooManyStreams, kinds_after, stream_scopes
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


def test_a_follower_of_some_kinds_reads_only_those_and_goes_on_after_the_log_s_newest(uow: FakeUnitOfWork) -> None:
    for n in range(5):
        uow.events.append("tunnel.created", f"t{n}", {"state": "up"}, scope="tunnels:read")
        uow.events.append("policy.revision", f"p{n}", {"revision": n + 1})
    uow.commit()
    everything = uow.events.after(0, scopes=None)
    found, last = kinds_after(uow, 0, {"policy.revision"})
    assert [e["subject"] for e in found] == ["p0", "p1", "p2", "p3", "p4"]
    assert last == everything[-1]["id"]  # past the tunnel events too: they are never read again
    assert kinds_after(uow, last, {"policy.revision"}) == ([], last)
    page, upto = kinds_after(uow, 0, {"policy.revision"}, limit=2)  # a full page: the rest next time
    assert [e["subject"] for e in page] == ["p0", "p1"] and upto == page[-1]["id"]  # noqa: PT018
    rest, _ = kinds_after(uow, upto, {"policy.revision"})
    assert [e["subject"] for e in rest] == ["p2", "p3", "p4"]


def test_an_event_that_comes_in_between_the_two_reads_is_left_for_the_next_look(uow: FakeUnitOfWork) -> None:
    uow.events.append("policy.revision", "p0", {"revision": 1})
    uow.commit()
    newest = uow.events.last_id()
    later = uow.events.last_id

    def after_a_commit_elsewhere(*args: object, **kwargs: object) -> list[dict[str, object]]:
        uow.events.append("policy.revision", "p1", {"revision": 2})
        uow.commit()
        return type(uow.events).after(uow.events, *args, **kwargs)  # type: ignore[arg-type]

    uow.events.after = after_a_commit_elsewhere  # type: ignore[method-assign]
    found, last = kinds_after(uow, 0, {"policy.revision"})
    assert [e["subject"] for e in found] == ["p0"] and last == newest  # noqa: PT018
    del uow.events.after
    found, last = kinds_after(uow, last, {"policy.revision"})
    assert [e["subject"] for e in found] == ["p1"] and last == later()  # noqa: PT018
