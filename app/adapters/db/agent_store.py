"""The tunnel agent's state in SQL (:class:`app.domain.agent.ports.AgentStore`): units of work
over a SQLAlchemy session and the repositories of :mod:`app.adapters.db.agent`, and the
request transactions of agent messages on the hot path (:mod:`app.adapters.db.hot` and
:mod:`app.adapters.db.agent_hot`: one precompiled statement per call on the driver's cursor, no
ORM, no Session)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import cached_property

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.adapters.db.agent import (
    HandoffRepository,
    InvitationRepository,
    LeaseRepository,
    NonceRepository,
    PendingRevocationRepository,
    RevocationRepository,
    SessionRepository,
    UserRepository,
)
from app.adapters.db.agent_hot import (
    add_session,
    claim_nonce,
    device_grants,
    find_user,
    finish_session,
    get_session,
    held_sessions,
    is_revoked,
    leased_addresses,
    release_leases,
    revocation_pending,
    spend_grant,
    take_lease,
)
from app.adapters.db.hot import HotTransaction, engine_of
from app.adapters.db.unit_of_work import SessionTransaction
from app.domain.agent import AgentSessionState, EnrolledUser
from app.domain.agent.ports import AgentSession, DeviceGrant

__all__ = ["SqlAgentRequest", "SqlAgentStore", "SqlAgentUnitOfWork"]


class SqlAgentUnitOfWork(SessionTransaction):
    """The agent's stores over one session of its own (closed, rolling back what was not
    committed, on leaving ``with``)."""

    def __init__(self, session: Session) -> None:
        super().__init__(session, owned=True)

    @cached_property
    def users(self) -> UserRepository:
        return UserRepository(self.session)

    @cached_property
    def nonces(self) -> NonceRepository:
        return NonceRepository(self.session)

    @cached_property
    def sessions(self) -> SessionRepository:
        return SessionRepository(self.session)

    @cached_property
    def leases(self) -> LeaseRepository:
        return LeaseRepository(self.session)

    @cached_property
    def handoffs(self) -> HandoffRepository:
        return HandoffRepository(self.session)

    @cached_property
    def revocations(self) -> RevocationRepository:
        return RevocationRepository(self.session)

    @cached_property
    def pending_revocations(self) -> PendingRevocationRepository:
        return PendingRevocationRepository(self.session)

    @cached_property
    def invitations(self) -> InvitationRepository:
        return InvitationRepository(self.session)


class SqlAgentRequest:
    """One agent message's write transaction: a :class:`~app.adapters.db.hot.HotTransaction`
    (begun at once: ``BEGIN IMMEDIATE`` on SQLite) and the hot functions on its cursor.
    Leaving ``with`` on an error rolls back (a connection the error showed dead is dropped)."""

    __slots__ = ("_cursor", "_transaction")

    def __init__(self, engine: Engine) -> None:
        self._transaction = HotTransaction(engine)
        self._cursor = self._transaction.cursor

    def find_user(self, user_id: str) -> EnrolledUser | None:
        return find_user(self._cursor, user_id)

    def claim_nonce(self, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
        return claim_nonce(self._cursor, scope, sender, nonce, expires_at)

    def is_revoked(self, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        return is_revoked(self._cursor, user_id, sign_public_key, host_id)

    def held_sessions(self, host_id: str, user_id: str) -> tuple[int, int]:
        return held_sessions(self._cursor, host_id, user_id)

    def revocation_pending(self, user_id: str, target_id: str) -> bool:
        return revocation_pending(self._cursor, user_id, target_id)

    def leased_addresses(self) -> set[str]:
        return leased_addresses(self._cursor)

    def take_lease(self, address: str, ticket: str) -> bool:
        return take_lease(self._cursor, address, ticket)

    def add_session(self, session: AgentSession) -> None:
        add_session(self._cursor, session)

    def session(self, ticket: str) -> AgentSession | None:
        return get_session(self._cursor, ticket)

    def finish_session(self, ticket: str, state: AgentSessionState, reason: str) -> bool:
        return finish_session(self._cursor, ticket, state, reason)

    def release_lease(self, ticket: str) -> None:
        release_leases(self._cursor, ticket)

    def device_grants(self, user_id: str, sign_public_key: bytes) -> list[DeviceGrant]:
        return device_grants(self._cursor, user_id, sign_public_key)

    def spend_grant(self, invitation_id: str, now: datetime) -> bool:
        return spend_grant(self._cursor, invitation_id, now)

    def commit(self) -> None:
        self._transaction.commit()

    def rollback(self) -> None:
        self._transaction.rollback()

    def __enter__(self) -> SqlAgentRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if isinstance(exc[1], BaseException):
                self._transaction.abort(exc[1])
        finally:
            self._transaction.close()


class SqlAgentStore:
    """The agent's state in the database of ``session_factory``.

    Raises:
        ValueError: a database other than SQLite or PostgreSQL (said when it is built, at start-up).
    """

    def __init__(self, session_factory: Callable[[], Session]) -> None:
        self._sessions = session_factory
        self._engine = engine_of(session_factory)

    def unit(self) -> SqlAgentUnitOfWork:
        return SqlAgentUnitOfWork(self._sessions())

    def request(self) -> SqlAgentRequest:
        return SqlAgentRequest(self._engine)
