"""The agent store's contract (``app.domain.agent.ports``): the SQL store (units of work over the
repositories, request transactions on the hot path) on SQLite and PostgreSQL and the in-memory
fake of ``tests/fakes/agent_store.py`` pass the same tests: single-use nonces and leases (also
under concurrency), Target's revocation list, single-use tickets, enrolled users."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.agent import AgentSessionState, EnrolledUser, b64e
from app.domain.agent.ports import AgentSession, AgentStore, WaitingHandoff
from app.domain.errors import AlreadyExists, NotFound
from tests.contract.agent_stores import at_once, store

__all__ = ["store"]  # an agent store of every kind, shared

LATER = datetime.now(UTC) + timedelta(days=1)  # not expired whenever in the run a test uses it
KEY_A, KEY_B = b"\x01" * 32, b"\x02" * 32


def _session(ticket: str, **changes: object) -> AgentSession:
    session = AgentSession(ticket=ticket, user_id="a", host_id="h", request_id="00" * 16, objective_id=3,
                           protection="esp", conn=f"qoss-agent-{ticket[:16]}", pool=None, virtual_ip="10.8.0.1",
                           client_identity="x.a", suite={}, state="active", expires_at=LATER)
    return replace(session, **changes)  # type: ignore[arg-type]


# ------------------------------------------------------------------ nonces


def test_a_nonce_is_claimed_once_and_a_clash_leaves_the_transaction_usable(store: AgentStore) -> None:
    with store.unit() as uow:
        assert uow.nonces.claim("target", "user:a", b"n" * 16, LATER)
        assert not uow.nonces.claim("target", "user:a", b"n" * 16, LATER)
        assert uow.nonces.claim("target", "user:b", b"n" * 16, LATER)  # the same transaction goes on
        uow.commit()
    with store.request() as transaction:
        assert not transaction.claim_nonce("target", "user:a", b"n" * 16, LATER)
        assert transaction.claim_nonce("host", "user:a", b"n" * 16, LATER)
        transaction.commit()
    with store.unit() as uow:
        assert not uow.nonces.claim("host", "user:a", b"n" * 16, LATER)


def test_twenty_concurrent_claims_of_one_nonce_one_wins(store: AgentStore) -> None:
    results: list[bool] = []

    def claim(_: int) -> None:
        with store.request() as transaction:
            results.append(transaction.claim_nonce("host", "user:c", b"c" * 16, LATER))
            transaction.commit()

    at_once(20, claim)
    assert sorted(results) == [False] * 19 + [True]


def test_a_request_left_uncommitted_or_failed_leaves_nothing(store: AgentStore) -> None:
    with store.request() as transaction:
        assert transaction.claim_nonce("host", "user:d", b"d" * 16, LATER)

    def refused_after_the_claim() -> None:
        with store.request() as transaction:
            assert transaction.claim_nonce("host", "user:d", b"d" * 16, LATER)
            raise RuntimeError("refused after the claim")

    with pytest.raises(RuntimeError):
        refused_after_the_claim()
    with store.request() as transaction:
        assert transaction.claim_nonce("host", "user:d", b"d" * 16, LATER)
        transaction.rollback()
    with store.unit() as uow:
        assert uow.nonces.claim("host", "user:d", b"d" * 16, LATER)
        uow.rollback()
    with store.unit() as uow:
        assert uow.nonces.claim("host", "user:d", b"d" * 16, LATER)


def test_stale_nonces_are_purged(store: AgentStore) -> None:
    now = datetime.now(UTC)
    with store.unit() as uow:
        uow.nonces.claim("host", "user:e", b"old", now - timedelta(seconds=1))
        uow.nonces.claim("host", "user:e", b"new", now + timedelta(seconds=60))
        uow.commit()
    with store.unit() as uow:
        assert uow.nonces.purge(now) == 1
        uow.commit()
    with store.unit() as uow:
        assert uow.nonces.claim("host", "user:e", b"old", LATER)
        assert not uow.nonces.claim("host", "user:e", b"new", LATER)


# ------------------------------------------------------------------ leases and revocations


def test_an_address_is_leased_once(store: AgentStore) -> None:
    with store.unit() as uow:
        assert uow.leases.take("10.8.0.1", "t" * 32)
        assert not uow.leases.take("10.8.0.1", "u" * 32)
        assert uow.leases.taken() == {"10.8.0.1"}
        uow.leases.release("t" * 32)
        assert uow.leases.take("10.8.0.1", "u" * 32)
        uow.commit()
    with store.request() as transaction:
        assert transaction.leased_addresses() == {"10.8.0.1"}
        assert not transaction.take_lease("10.8.0.1", "v" * 32)
        assert transaction.take_lease("10.8.0.2", "v" * 32)
        assert not transaction.take_lease("10.8.0.3", "v" * 32)  # one address a ticket
        transaction.commit()
    with store.unit() as uow:
        assert uow.leases.taken() == {"10.8.0.1", "10.8.0.2"}


def test_revocations_are_per_host_user_and_key(store: AgentStore) -> None:
    with store.unit() as uow:
        assert uow.revocations.add(user_id="dave", sign_public_key=KEY_A, host_id="host-1")
        assert not uow.revocations.add(user_id="dave", sign_public_key=KEY_A, host_id="host-1")
        uow.commit()
    with store.unit() as uow:
        assert uow.revocations.revoked("dave", KEY_A, "host-1")
        assert not uow.revocations.revoked("dave", KEY_A, "host-2")  # another Host's dave is another user
        assert not uow.revocations.revoked("dave", KEY_B, "host-1")  # re-enrolled with new keys
        assert not uow.revocations.revoked("erin", KEY_A, "host-1")
        [record] = uow.revocations.all()
        assert (record.user_id, record.host_id, record.sign_public_key) == ("dave", "host-1", b64e(KEY_A))
        assert record.revoked_at.tzinfo is not None
        assert uow.revocations.add(user_id="dave", sign_public_key=KEY_A, host_id="host-2")
        assert uow.revocations.add(user_id="erin", sign_public_key=KEY_B, host_id="host-1")
        assert [r.user_id for r in uow.revocations.all(1)] == ["erin"]  # newest first
    with store.request() as transaction:
        assert transaction.is_revoked("dave", KEY_A, "host-1")
        assert not transaction.is_revoked("dave", KEY_A, "host-2")  # never committed
        assert not transaction.is_revoked("erin", KEY_B, "host-1")


def test_devices_and_tunnels_held_are_counted_per_host_and_user(store: AgentStore) -> None:
    with store.unit() as uow:
        uow.sessions.add(_session("a" * 32, platform="android"))
        uow.sessions.add(_session("b" * 32, platform="apple"))
        uow.sessions.add(_session("c" * 32))  # a client's tunnel, not a device
        uow.sessions.add(_session("d" * 32, platform="android", host_id="other"))
        uow.sessions.add(_session("e" * 32, platform="android", user_id="b"))
        uow.sessions.add(_session("f" * 32, platform="android"))
        assert uow.sessions.finish("f" * 32, AgentSessionState.REVOKED, "revoked by its user")
        uow.sessions.add(_session("g" * 32, protection="native", virtual_ip=None))  # holds no address
        uow.commit()
    with store.request() as transaction:
        assert transaction.held_sessions("h", "a") == (2, 1)
        assert transaction.held_sessions("other", "a") == (1, 0)
        assert transaction.held_sessions("h", "b") == (1, 0)
        assert transaction.held_sessions("h", "nobody") == (0, 0)


def test_two_enrolments_of_one_user_are_counted_one_after_the_other(store: AgentStore) -> None:
    """The count holds the (Host, user) until its transaction ends: a second transaction's count
    waits for the first's device, so a quota cannot be passed by sending enrolments at once."""
    seen: list[tuple[int, int]] = []
    with store.request() as first:
        assert first.held_sessions("h", "a") == (0, 0)

        def second() -> None:
            with store.request() as transaction:
                seen.append(transaction.held_sessions("h", "a"))
                transaction.commit()

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=0.5)
        assert seen == []  # still waiting for the first
        first.add_session(_session("a" * 32, platform="android"))
        first.commit()
    thread.join(timeout=30)
    assert seen == [(1, 0)]


def test_a_pending_revocation_is_kept_postponed_and_confirmed_for_its_key_only(store: AgentStore) -> None:
    now = datetime.now(UTC)
    with store.unit() as uow:
        uow.pending_revocations.add(target_id="far", user_id="dave", sign_public_key=KEY_A, now=now)
        uow.pending_revocations.add(target_id="near", user_id="dave", sign_public_key=KEY_A, now=now)
        uow.commit()
    with store.request() as transaction:
        assert transaction.revocation_pending("dave", "far")
        assert not transaction.revocation_pending("erin", "far")
        assert not transaction.revocation_pending("dave", "elsewhere")
    with store.unit() as uow:
        assert [(p.target_id, p.attempts) for p in uow.pending_revocations.due(now)] == [("far", 0), ("near", 0)]
        uow.pending_revocations.postpone("far", "dave", attempts=1, next_attempt_at=now + timedelta(seconds=5),
                                         error="target unreachable")
        uow.commit()
    with store.unit() as uow:
        assert [p.target_id for p in uow.pending_revocations.due(now)] == ["near"]
        assert [p.target_id for p in uow.pending_revocations.due(now + timedelta(seconds=5), limit=1)] == [
            "near"]  # the most overdue first
        later = uow.pending_revocations.due(now + timedelta(seconds=5))[1]
        assert (later.target_id, later.attempts, later.last_error, later.sign_public_key) == (
            "far", 1, "target unreachable", KEY_A)
        assert not uow.pending_revocations.confirm("far", "dave", KEY_B)  # not the key it was kept for
        assert uow.pending_revocations.confirm("far", "dave", KEY_A)
        uow.pending_revocations.forget("near", "dave")
        uow.commit()
    with store.unit() as uow:
        assert uow.pending_revocations.of_user("dave") == []


# ------------------------------------------------------------------ sessions


def test_a_ticket_is_single_use(store: AgentStore) -> None:
    with store.unit() as uow:
        uow.sessions.add(_session("a" * 32))
        uow.commit()
    with pytest.raises(AlreadyExists), store.unit() as uow:
        uow.sessions.add(_session("a" * 32))
    with pytest.raises(AlreadyExists), store.request() as transaction:
        transaction.add_session(_session("a" * 32))


def test_a_session_gets_its_defaults_and_reads_back(store: AgentStore) -> None:
    suite = {"esp": "aes128gcm16-x25519", "levels": {"c": 7}, "notes": ["a", "b"]}
    with store.request() as transaction:
        transaction.add_session(_session("b" * 32, suite=suite))
        transaction.commit()
    with store.unit() as uow:
        row = uow.sessions.get("b" * 32)
        assert uow.sessions.get("c" * 32) is None
    assert row is not None
    assert (row.reason, row.suite, row.virtual_ip, row.expires_at) == ("", suite, "10.8.0.1", LATER)
    assert row.created_at.tzinfo is not None
    assert row.updated_at == row.created_at
    assert row.provenance is None  # a session made before provenance was kept


def test_a_sessions_provenance_reads_back_from_either_path(store: AgentStore) -> None:
    origin = {"request": {"objective_id": 3, "min_levels": {"confidentiality": 6}, "supports": None,
                          "target_supports": ["aes128gcm16", "x25519"], "backend": None, "policy": None},
              "tables": {"standards-2026": 4}, "policy_revision": None, "cost": 1.25}
    with store.request() as transaction:
        transaction.add_session(_session("d" * 32, provenance=origin))
        transaction.commit()
    with store.unit() as uow:
        uow.sessions.add(_session("e" * 32, provenance=origin))
        uow.commit()
    with store.unit() as uow:
        found = [uow.sessions.get(t) for t in ("d" * 32, "e" * 32)]
        listed = uow.sessions.select(state=AgentSessionState.ACTIVE)
    assert [s.provenance if s else None for s in found] == [origin, origin]
    assert [s.provenance for s in listed] == [origin, origin]


def test_sessions_are_listed_newest_first_and_finished_once(store: AgentStore) -> None:
    now = datetime.now(UTC)
    with store.unit() as uow:
        uow.sessions.add(_session("1" * 32, created_at=now - timedelta(seconds=3), expires_at=now))
        uow.sessions.add(_session("2" * 32, created_at=now - timedelta(seconds=2), user_id="b"))
        uow.sessions.add(_session("3" * 32, created_at=now - timedelta(seconds=1)))
        uow.commit()
    with store.unit() as uow:
        assert [s.ticket[0] for s in uow.sessions.select()] == ["3", "2", "1"]
        assert [s.ticket[0] for s in uow.sessions.select(user_id="a", limit=1)] == ["3"]
        assert [s.ticket[0] for s in uow.sessions.expired(now)] == ["1"]
        assert uow.sessions.finish("1" * 32, AgentSessionState.EXPIRED, "x" * 300)
        assert not uow.sessions.finish("1" * 32, AgentSessionState.CLOSED, "again")
        assert not uow.sessions.finish("9" * 32, AgentSessionState.CLOSED, "no such ticket")
        uow.commit()
    with store.unit() as uow:
        assert uow.sessions.expired(now) == []
        assert [s.ticket[0] for s in uow.sessions.select(state=AgentSessionState.ACTIVE)] == ["3", "2"]
        [ended] = uow.sessions.select(state=AgentSessionState.EXPIRED)
    assert (ended.state, ended.reason) == ("expired", "x" * 200)
    assert ended.updated_at is not None
    assert ended.updated_at >= ended.created_at


def test_a_messages_transaction_reads_ends_a_session_once_and_frees_its_lease(store: AgentStore) -> None:
    origin = {"tables": {"standards-2026": 4}, "cost": 1.25}
    with store.request() as transaction:
        transaction.add_session(_session("4" * 32, provenance=origin, platform="android"))
        assert transaction.take_lease("10.8.0.4", "4" * 32)
        transaction.commit()
    with store.unit() as uow:
        by_unit = uow.sessions.get("4" * 32)
    with store.request() as transaction:
        assert transaction.session("4" * 32) == by_unit  # the same record either way
        assert transaction.session("5" * 32) is None
        assert transaction.finish_session("4" * 32, AgentSessionState.REVOKED, "y" * 300)
        assert not transaction.finish_session("4" * 32, AgentSessionState.CLOSED, "again")
        assert not transaction.finish_session("5" * 32, AgentSessionState.CLOSED, "no such ticket")
        ended = transaction.session("4" * 32)  # this transaction's own change
        transaction.release_lease("4" * 32)
        transaction.release_lease("5" * 32)  # none: nothing happens
        assert transaction.leased_addresses() == set()
        transaction.commit()
    assert by_unit is not None and ended is not None  # noqa: PT018
    assert (ended.state, ended.reason, ended.platform, ended.provenance) == ("revoked", "y" * 200, "android", origin)
    assert ended.updated_at is not None and ended.updated_at >= by_unit.created_at  # noqa: PT018
    with store.unit() as uow:
        assert uow.sessions.get("4" * 32) == ended
        assert uow.leases.taken() == set()


def test_a_session_ended_in_a_message_s_transaction_left_uncommitted_stays_active(store: AgentStore) -> None:
    with store.request() as transaction:
        transaction.add_session(_session("6" * 32))
        assert transaction.take_lease("10.8.0.6", "6" * 32)
        transaction.commit()
    with store.request() as transaction:
        assert transaction.finish_session("6" * 32, AgentSessionState.CLOSED, "gone")
        transaction.release_lease("6" * 32)
    with store.unit() as uow:
        row = uow.sessions.get("6" * 32)
        assert row is not None and row.state == "active"  # noqa: PT018
        assert uow.leases.taken() == {"10.8.0.6"}


# ------------------------------------------------------------------ users


def test_a_user_is_enrolled_once_found_revoked_and_enrolled_again(store: AgentStore) -> None:
    user = EnrolledUser(user_id="fay", sign_public_key=KEY_A, kem_public_key=KEY_B, objectives=frozenset({2, 3}))
    with store.unit() as uow:
        uow.users.enroll(user)
        uow.commit()
    with pytest.raises(AlreadyExists), store.unit() as uow:
        uow.users.enroll(user)
    with store.request() as transaction:
        assert transaction.find_user("fay") == user
        assert transaction.find_user("gus") is None
    with store.unit() as uow:
        assert uow.users.revoke("fay")
        assert not uow.users.revoke("fay")
        with pytest.raises(NotFound):
            uow.users.revoke("gus")
        uow.commit()
    with store.unit() as uow:
        found = uow.users.find("fay")
        assert found is not None
        assert found.revoked
        [(listed, created, revoked)] = uow.users.all()
        assert listed.revoked
        assert revoked is not None
        assert created <= revoked
        uow.users.enroll(replace(user, sign_public_key=KEY_B, objectives=frozenset({1})))
        uow.users.enroll(replace(user, user_id="abe"))
        uow.commit()
    with store.unit() as uow:
        assert [(u.user_id, u.sign_public_key, sorted(u.objectives), r) for u, _, r in uow.users.all()] == [
            ("abe", KEY_A, [2, 3], None), ("fay", KEY_B, [1], None)]


# ------------------------------------------------------------------ handoffs


def test_a_handoff_is_taken_once_and_a_users_handoffs_are_forgotten_together(store: AgentStore) -> None:
    now = datetime.now(UTC)
    with store.unit() as uow:
        for digest, user in (("d1", "a"), ("d2", "a"), ("d3", "b")):
            uow.handoffs.add(digest=digest, user_id=user, profile_name=f"{digest}.sswan",
                             media_type="application/vnd.strongswan.profile", profile=digest.encode(),
                             expires_at=LATER)
        uow.commit()
    with store.unit() as uow:
        assert uow.handoffs.take("d3", now) == WaitingHandoff("b", "d3.sswan", "application/vnd.strongswan.profile",
                                                              b"d3")
        assert uow.handoffs.take("d3", now) is None
        assert uow.handoffs.forget_user("a") == 2
        assert uow.handoffs.take("d1", now) is None
        uow.commit()
    with store.unit() as uow:
        assert uow.handoffs.forget_user("a") == 0
        assert uow.handoffs.purge(LATER + timedelta(days=1)) == 0  # nothing left
