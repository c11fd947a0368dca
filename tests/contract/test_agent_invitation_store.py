"""The invitation store's contract (``InvitationStore`` and the request transaction's grants in
``app.domain.agent.ports``): the SQL store on SQLite and PostgreSQL and the in-memory fake redeem
an invitation once (also under concurrency), never an expired or revoked one, name the keys that
redeemed it, and spend its device enrolment once, until it is given back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.domain.agent import b64e
from app.domain.agent.ports import AgentStore, Invitation
from tests.contract.agent_stores import at_once, store

__all__ = ["store"]  # an agent store of every kind, shared

NOW = datetime.now(UTC)
KEY = b"\x07" * 32


def invitation(invitation_id: str, *, user: str = "amy", created: datetime = NOW,
               expires: datetime = NOW + timedelta(minutes=15)) -> Invitation:
    return Invitation(id=invitation_id, digest=invitation_id.ljust(64, "0"), user_id=user, platform="android",
                      objectives=(3,), minimums={"integrity": 4}, created_by="admin", created_at=created,
                      expires_at=expires)


def added(store: AgentStore, *invitations: Invitation) -> None:
    with store.unit() as uow:
        for i in invitations:
            uow.invitations.add(i)
        uow.commit()


def test_an_invitation_is_found_by_its_digest_and_listed_newest_first(store: AgentStore) -> None:
    added(store, invitation("a1"), invitation("b2", created=NOW + timedelta(seconds=1), user="bo"))
    with store.unit() as uow:
        found = uow.invitations.by_digest("a1".ljust(64, "0"))
        assert found is not None
        assert (found.id, found.user_id, found.objectives, found.minimums) == ("a1", "amy", (3,), {"integrity": 4})
        assert uow.invitations.by_digest("ff" * 32) is None
        assert [i.id for i in uow.invitations.select()] == ["b2", "a1"]
        assert [i.id for i in uow.invitations.select(user_id="amy")] == ["a1"]


def test_ten_concurrent_redemptions_of_one_invitation_one_wins(store: AgentStore) -> None:
    added(store, invitation("c3"))
    results: list[bool] = []

    def redeem(n: int) -> None:
        with store.unit() as uow:
            results.append(uow.invitations.redeem("c3", sign_public_key=b64e(bytes([n]) * 32), now=NOW))
            uow.commit()

    at_once(10, redeem)
    assert sorted(results) == [False] * 9 + [True]


def test_an_expired_or_revoked_invitation_is_not_redeemed(store: AgentStore) -> None:
    added(store, invitation("d4", expires=NOW - timedelta(seconds=1)), invitation("e5"))
    with store.unit() as uow:
        assert not uow.invitations.redeem("d4", sign_public_key=b64e(KEY), now=NOW)
        assert uow.invitations.revoke("e5", NOW)
        assert not uow.invitations.revoke("e5", NOW)
        assert not uow.invitations.redeem("e5", sign_public_key=b64e(KEY), now=NOW)
        assert not uow.invitations.invited("amy", b64e(KEY))
        uow.commit()


def test_a_redeemed_invitations_device_enrolment_is_spent_once_until_given_back(store: AgentStore) -> None:
    added(store, invitation("f6"), invitation("g7"))
    with store.unit() as uow:
        assert uow.invitations.redeem("f6", sign_public_key=b64e(KEY), now=NOW)
        assert uow.invitations.withdraw_user("amy", NOW) == 1  # g7, never used
        assert uow.invitations.invited("amy", b64e(KEY))
        uow.commit()
    with store.request() as transaction:
        (grant,) = transaction.device_grants("amy", KEY)
        assert (grant.invitation_id, grant.platform, grant.minimums, grant.spent_at) == (
            "f6", "android", {"integrity": 4}, None)
        assert transaction.device_grants("amy", b"\x08" * 32) == []
        assert transaction.spend_grant("f6", NOW)
        assert not transaction.spend_grant("f6", NOW)
        transaction.commit()
    with store.request() as transaction:
        assert transaction.device_grants("amy", KEY)[0].spent_at is not None
    with store.unit() as uow:
        uow.invitations.restore_grant("f6")
        uow.commit()
    with store.request() as transaction:
        assert transaction.spend_grant("f6", NOW)
        transaction.commit()
