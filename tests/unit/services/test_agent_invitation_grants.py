"""An invitation grants the keys that redeemed it exactly one device enrolment of its platform: the
enrolment spends it, a second one with the same keys is refused until a new invitation grants
another; keys of a user's own need no grant; a grant given back (the enrolment failed) is usable
again. On the in-memory store (the SQL one runs the same through the API tests)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.agent import AgentRejected, EnrolledUser, b64e
from app.domain.agent.ports import Invitation
from app.services.agent.invitations import take_grant
from tests.fakes.agent_store import FakeAgentStore

SIGN, KEM = bytes(range(32)), bytes(range(1, 33))
USER = EnrolledUser(user_id="amy", sign_public_key=SIGN, kem_public_key=KEM, objectives=frozenset({3}))


def granted(store: FakeAgentStore, invitation_id: str, *, platform: str = "android",
            minimums: dict[str, int] | None = None) -> None:
    now = datetime.now(UTC)
    with store.unit() as uow:
        uow.invitations.add(Invitation(id=invitation_id, digest=invitation_id * 4, user_id="amy", platform=platform,
                                       objectives=(3,), minimums=minimums or {}, created_by="admin", created_at=now,
                                       expires_at=now + timedelta(minutes=15)))
        assert uow.invitations.redeem(invitation_id, sign_public_key=b64e(SIGN), now=now)
        uow.commit()


def spend(store: FakeAgentStore, platform: str | None = "android", levels: dict[str, int] | None = None) -> str | None:
    with store.request() as transaction:
        found = take_grant(transaction, USER, platform=platform, min_levels=levels or {}, now=time.time())
        transaction.commit()
    return found


def test_a_grant_enrols_one_device_and_a_second_is_refused() -> None:
    store = FakeAgentStore()
    granted(store, "a1")
    assert spend(store) == "a1"
    with pytest.raises(AgentRejected) as refused:
        spend(store)
    assert "no device enrolment granted" in refused.value.reason
    granted(store, "a2")
    assert spend(store) == "a2"


def test_keys_of_the_users_own_need_no_grant() -> None:
    assert spend(FakeAgentStore()) is None
    assert spend(FakeAgentStore(), platform=None) is None


def test_invited_keys_ask_for_no_tunnel_and_no_other_platform() -> None:
    store = FakeAgentStore()
    granted(store, "b1", platform="apple")
    with pytest.raises(AgentRejected) as refused:
        spend(store, platform=None)
    assert "devices only" in refused.value.reason
    with pytest.raises(AgentRejected) as refused:
        spend(store, platform="android")
    assert "no device enrolment granted" in refused.value.reason
    assert spend(store, platform="apple") == "b1"


def test_an_enrolment_below_the_invitations_minimums_is_refused() -> None:
    store = FakeAgentStore()
    granted(store, "c1", minimums={"confidentiality": 8})
    with pytest.raises(AgentRejected) as refused:
        spend(store, levels={"confidentiality": 5})
    assert "minimums" in refused.value.reason
    assert spend(store, levels={"confidentiality": 9}) == "c1"


def test_a_grant_given_back_is_usable_again() -> None:
    store = FakeAgentStore()
    granted(store, "d1")
    assert spend(store) == "d1"
    with store.unit() as uow:
        uow.invitations.restore_grant("d1")
        uow.commit()
    assert spend(store) == "d1"
