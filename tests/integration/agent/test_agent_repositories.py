"""The agent's repositories on real SQLite and PostgreSQL (schema from the migrations): single-use
nonces and leases with one ``INSERT ... ON CONFLICT DO NOTHING`` each, also under concurrency,
Target's revocation list, and single-use tickets."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.agent import (
    AgentSessionRow,
    LeaseRepository,
    NonceRepository,
    RevocationRepository,
    SessionRepository,
    UserRepository,
)
from app.domain.agent import EnrolledUser
from app.domain.errors import AlreadyExists

LATER = datetime.now(UTC) + timedelta(minutes=5)
KEY_A, KEY_B = b"\x01" * 32, b"\x02" * 32


def test_a_nonce_is_claimed_once_and_a_clash_leaves_the_transaction_usable(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory() as session, session.begin():
        nonces = NonceRepository(session)
        assert nonces.claim("target", "user:a", b"n" * 16, LATER)
        assert not nonces.claim("target", "user:a", b"n" * 16, LATER)
        assert nonces.claim("target", "user:b", b"n" * 16, LATER)  # the same transaction goes on
    with session_factory() as session, session.begin():
        assert not NonceRepository(session).claim("target", "user:a", b"n" * 16, LATER)
        assert NonceRepository(session).claim("host", "user:a", b"n" * 16, LATER)


def test_twenty_concurrent_claims_of_one_nonce_one_wins(session_factory: sessionmaker[Session]) -> None:
    results: list[bool] = []
    barrier = threading.Barrier(20)

    def claim() -> None:
        barrier.wait()
        with session_factory() as session, session.begin():
            results.append(NonceRepository(session).claim("host", "user:c", b"c" * 16, LATER))

    threads = [threading.Thread(target=claim) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [False] * 19 + [True]


def test_an_address_is_leased_once(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session, session.begin():
        leases = LeaseRepository(session)
        assert leases.take("10.8.0.1", "t" * 32)
        assert not leases.take("10.8.0.1", "u" * 32)
        assert leases.taken() == {"10.8.0.1"}
        leases.release("t" * 32)
        assert leases.take("10.8.0.1", "u" * 32)


def test_revocations_are_per_user_and_key(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session, session.begin():
        revocations = RevocationRepository(session)
        assert revocations.add(user_id="dave", sign_public_key=KEY_A, host_id="host-1")
        assert not revocations.add(user_id="dave", sign_public_key=KEY_A, host_id="host-2")
    with session_factory() as session:
        revocations = RevocationRepository(session)
        assert revocations.revoked("dave", KEY_A)
        assert not revocations.revoked("dave", KEY_B)  # re-enrolled with new keys
        assert not revocations.revoked("erin", KEY_A)
        assert [(r.user_id, r.host_id) for r in revocations.all()] == [("dave", "host-1")]


def _row(ticket: str) -> AgentSessionRow:
    return AgentSessionRow(ticket=ticket, user_id="a", host_id="h", request_id="00" * 16, objective_id=3,
                           protection="esp", conn=f"qoss-agent-{ticket[:16]}", pool=None, virtual_ip="10.8.0.1",
                           client_identity="x.a", suite={}, state="active", expires_at=LATER)


def test_a_ticket_is_single_use(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session, session.begin():
        SessionRepository(session).add(_row("a" * 32))
    with pytest.raises(AlreadyExists), session_factory() as session, session.begin():
        SessionRepository(session).add(_row("a" * 32))


def test_a_session_row_gets_its_defaults_and_reads_back(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session, session.begin():
        SessionRepository(session).add(_row("b" * 32))
    with session_factory() as session:
        row = SessionRepository(session).get("b" * 32)
        assert row is not None
        assert (row.reason, row.suite, row.virtual_ip, row.expires_at) == ("", {}, "10.8.0.1", LATER)
        assert row.created_at is not None
        assert row.updated_at is not None


def test_a_user_is_found_with_keys_objectives_and_revocation(session_factory: sessionmaker[Session]) -> None:
    user = EnrolledUser(user_id="fay", sign_public_key=KEY_A, kem_public_key=KEY_B, objectives=frozenset({2, 3}),
                        revoked=False)
    with session_factory() as session, session.begin():
        UserRepository(session).enroll(user)
    with session_factory() as session:
        assert UserRepository(session).find("fay") == user
        assert UserRepository(session).find("gus") is None
    with session_factory() as session, session.begin():
        UserRepository(session).revoke("fay")
    with session_factory() as session:
        found = UserRepository(session).find("fay")
        assert found is not None
        assert found.revoked
