"""An in-memory store of the tunnel agent's state (``app.domain.agent.ports.AgentStore``), for
tests of the agent's roles that need neither SQLite nor PostgreSQL.

:class:`FakeAgentStore` holds the committed state. A transaction takes the store's one writer
lock when it first touches the state (a request transaction: at once), as SQLite's ``BEGIN
IMMEDIATE`` does, and works on a copy; ``commit`` writes the copy back and lets the lock go,
``rollback`` and leaving ``with`` uncommitted throw it away. The stores raise the domain's
errors exactly where the SQL ones do: ``tests/contract/test_agent_stores.py`` holds both to the
same behaviour.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from app.domain.agent import AgentSessionState, EnrolledUser, b64e
from app.domain.agent.ports import (
    AgentSession,
    DeviceGrant,
    Invitation,
    PendingRevocation,
    RevocationRecord,
    UserListing,
    WaitingHandoff,
)
from app.domain.errors import AlreadyExists, NotFound

__all__ = ["FakeAgentRequest", "FakeAgentStore", "FakeAgentUnitOfWork"]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _State:
    #: user id -> (the user, not revoked; enrolled at; revoked at)
    users: dict[str, tuple[EnrolledUser, datetime, datetime | None]] = field(default_factory=dict)
    #: (scope, sender, nonce in hex) -> expiry
    nonces: dict[tuple[str, str, str], datetime] = field(default_factory=dict)
    sessions: dict[str, AgentSession] = field(default_factory=dict)
    #: address -> ticket
    leases: dict[str, str] = field(default_factory=dict)
    #: (host id, user id, signing key in base64url) -> record
    revocations: dict[tuple[str, str, str], RevocationRecord] = field(default_factory=dict)
    #: digest -> (the profile, its expiry)
    handoffs: dict[str, tuple[WaitingHandoff, datetime]] = field(default_factory=dict)
    #: (target id, user id) -> Host's revocation not confirmed yet
    pending: dict[tuple[str, str], PendingRevocation] = field(default_factory=dict)
    #: id -> invitation
    invitations: dict[str, Invitation] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(dict(self.users), dict(self.nonces), dict(self.sessions), dict(self.leases),
                      dict(self.revocations), dict(self.handoffs), dict(self.pending), dict(self.invitations))


class FakeAgentStore:
    """The committed state and its one writer lock."""

    def __init__(self, *, lock_timeout: float = 10.0) -> None:
        self.state = _State()
        self.writer = threading.Lock()
        self.lock_timeout = lock_timeout

    def unit(self) -> FakeAgentUnitOfWork:
        return FakeAgentUnitOfWork(self)

    def request(self) -> FakeAgentRequest:
        return FakeAgentRequest(self)


class _Transaction:
    def __init__(self, store: FakeAgentStore) -> None:
        self._store = store
        self._copy: _State | None = None

    @property
    def state(self) -> _State:
        """This transaction's copy, begun (the writer lock taken) on first use."""
        if self._copy is None:
            if not self._store.writer.acquire(timeout=self._store.lock_timeout):
                raise TimeoutError("the fake agent store is locked (a transaction left open?)")
            self._copy = self._store.state.copy()
        return self._copy

    def _end(self, keep: bool) -> None:
        if self._copy is not None:
            if keep:
                self._store.state = self._copy
            self._copy = None
            self._store.writer.release()

    def commit(self) -> None:
        self._end(True)

    def rollback(self) -> None:
        self._end(False)

    def __exit__(self, *exc: object) -> None:
        self._end(False)


class _Users:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def enroll(self, user: EnrolledUser) -> None:
        users = self._tx.state.users
        found = users.get(user.user_id)
        if found is not None and found[2] is None:
            raise AlreadyExists(f"user {user.user_id} is enrolled already")
        users[user.user_id] = (replace(user, revoked=False), _now(), None)

    def find(self, user_id: str) -> EnrolledUser | None:
        found = self._tx.state.users.get(user_id)
        return None if found is None else replace(found[0], revoked=found[2] is not None)

    def all(self) -> list[UserListing]:
        users = self._tx.state.users
        return [(replace(u, revoked=r is not None), c, r) for u, c, r in (users[k] for k in sorted(users))]

    def revoke(self, user_id: str) -> bool:
        users = self._tx.state.users
        found = users.get(user_id)
        if found is None:
            raise NotFound(f"no user {user_id}")
        if found[2] is not None:
            return False
        users[user_id] = (found[0], found[1], _now())
        return True


class _Nonces:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def claim(self, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
        nonces, key = self._tx.state.nonces, (scope, sender, nonce.hex())
        if key in nonces:
            return False
        nonces[key] = expires_at
        return True

    def purge(self, now: datetime) -> int:
        nonces = self._tx.state.nonces
        stale = [k for k, expires in nonces.items() if expires < now]
        for k in stale:
            del nonces[k]
        return len(stale)


class _Sessions:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def add(self, session: AgentSession) -> None:
        sessions = self._tx.state.sessions
        if session.ticket in sessions:
            raise AlreadyExists("ticket exists")
        sessions[session.ticket] = replace(session, updated_at=session.updated_at or session.created_at)

    def get(self, ticket: str) -> AgentSession | None:
        return self._tx.state.sessions.get(ticket)

    def select(self, *, state: AgentSessionState | None = None, user_id: str | None = None,
               limit: int = 1000) -> list[AgentSession]:
        chosen = [s for s in self._tx.state.sessions.values()
                  if (state is None or s.state == state.value) and (user_id is None or s.user_id == user_id)]
        return sorted(chosen, key=lambda s: s.created_at, reverse=True)[:limit]

    def expired(self, now: datetime) -> list[AgentSession]:
        return [s for s in self._tx.state.sessions.values()
                if s.state == AgentSessionState.ACTIVE.value and s.expires_at <= now]

    def finish(self, ticket: str, state: AgentSessionState, reason: str) -> bool:
        sessions = self._tx.state.sessions
        found = sessions.get(ticket)
        if found is None or found.state != AgentSessionState.ACTIVE.value:
            return False
        sessions[ticket] = replace(found, state=state.value, reason=reason[:200], updated_at=_now())
        return True


class _Leases:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def taken(self) -> set[str]:
        return set(self._tx.state.leases)

    def take(self, address: str, ticket: str) -> bool:
        leases = self._tx.state.leases
        if address in leases or ticket in leases.values():  # both unique
            return False
        leases[address] = ticket
        return True

    def release(self, ticket: str) -> None:
        leases = self._tx.state.leases
        for address in [a for a, t in leases.items() if t == ticket]:
            del leases[address]


class _Revocations:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def add(self, *, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        revocations, key = self._tx.state.revocations, (host_id, user_id, b64e(sign_public_key))
        if key in revocations:
            return False
        revocations[key] = RevocationRecord(user_id=user_id, sign_public_key=key[2], host_id=host_id,
                                            revoked_at=_now())
        return True

    def revoked(self, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        return (host_id, user_id, b64e(sign_public_key)) in self._tx.state.revocations

    def all(self, limit: int | None = None) -> list[RevocationRecord]:
        return sorted(self._tx.state.revocations.values(), key=lambda r: r.revoked_at, reverse=True)[:limit]


class _Handoffs:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def add(self, *, digest: str, user_id: str, profile_name: str, media_type: str, profile: bytes,
            expires_at: datetime) -> None:
        self._tx.state.handoffs[digest] = (WaitingHandoff(user_id, profile_name, media_type, profile), expires_at)

    def take(self, digest: str, now: datetime) -> WaitingHandoff | None:
        found = self._tx.state.handoffs.pop(digest, None)
        return None if found is None or found[1] <= now else found[0]

    def forget_user(self, user_id: str) -> int:
        handoffs = self._tx.state.handoffs
        gone = [d for d, h in handoffs.items() if h[0].user_id == user_id]
        for d in gone:
            del handoffs[d]
        return len(gone)

    def purge(self, now: datetime) -> int:
        handoffs = self._tx.state.handoffs
        gone = [d for d, h in handoffs.items() if h[1] <= now]
        for d in gone:
            del handoffs[d]
        return len(gone)


class _Pending:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def add(self, *, target_id: str, user_id: str, sign_public_key: bytes, now: datetime) -> None:
        pending = self._tx.state.pending
        kept = pending.get((target_id, user_id))
        pending[(target_id, user_id)] = PendingRevocation(
            target_id=target_id, user_id=user_id, sign_public_key=sign_public_key, attempts=0, next_attempt_at=now,
            created_at=now if kept is None else kept.created_at)

    def due(self, now: datetime, limit: int = 100) -> list[PendingRevocation]:
        due = [p for p in self._tx.state.pending.values() if p.next_attempt_at <= now]
        return sorted(due, key=lambda p: p.next_attempt_at)[:limit]

    def of_user(self, user_id: str) -> list[PendingRevocation]:
        return sorted((p for p in self._tx.state.pending.values() if p.user_id == user_id), key=lambda p: p.target_id)

    def confirm(self, target_id: str, user_id: str, sign_public_key: bytes) -> bool:
        pending = self._tx.state.pending
        kept = pending.get((target_id, user_id))
        if kept is None or kept.sign_public_key != sign_public_key:
            return False
        del pending[(target_id, user_id)]
        return True

    def postpone(self, target_id: str, user_id: str, *, attempts: int, next_attempt_at: datetime,
                 error: str) -> None:
        pending = self._tx.state.pending
        kept = pending.get((target_id, user_id))
        if kept is not None:
            pending[(target_id, user_id)] = replace(kept, attempts=attempts, next_attempt_at=next_attempt_at,
                                                    last_error=error[:200])

    def forget(self, target_id: str, user_id: str) -> None:
        self._tx.state.pending.pop((target_id, user_id), None)


class _Invitations:
    def __init__(self, tx: _Transaction) -> None:
        self._tx = tx

    def add(self, invitation: Invitation) -> None:
        self._tx.state.invitations[invitation.id] = invitation

    def by_digest(self, digest: str) -> Invitation | None:
        return next((i for i in self._tx.state.invitations.values() if i.digest == digest), None)

    def get(self, invitation_id: str) -> Invitation | None:
        return self._tx.state.invitations.get(invitation_id)

    def select(self, *, user_id: str | None = None, limit: int = 100) -> list[Invitation]:
        found = [i for i in self._tx.state.invitations.values() if user_id is None or i.user_id == user_id]
        return sorted(found, key=lambda i: (-i.created_at.timestamp(), i.id))[:limit]

    def redeem(self, invitation_id: str, *, sign_public_key: str, now: datetime) -> bool:
        found = self._tx.state.invitations.get(invitation_id)
        if found is None or found.used_at or found.revoked_at or found.expires_at <= now:
            return False
        self._tx.state.invitations[invitation_id] = replace(found, used_at=now, sign_public_key=sign_public_key)
        return True

    def revoke(self, invitation_id: str, now: datetime) -> bool:
        found = self._tx.state.invitations.get(invitation_id)
        if found is None or found.used_at or found.revoked_at:
            return False
        self._tx.state.invitations[invitation_id] = replace(found, revoked_at=now)
        return True

    def invited(self, user_id: str, sign_public_key: str) -> bool:
        return any(i.user_id == user_id and i.sign_public_key == sign_public_key
                   for i in self._tx.state.invitations.values())

    def withdraw_user(self, user_id: str, now: datetime) -> int:
        invitations = self._tx.state.invitations
        waiting = [i for i in invitations.values() if i.user_id == user_id and not i.used_at and not i.revoked_at]
        for i in waiting:
            invitations[i.id] = replace(i, revoked_at=now)
        return len(waiting)

    def restore_grant(self, invitation_id: str) -> None:
        found = self._tx.state.invitations.get(invitation_id)
        if found is not None:
            self._tx.state.invitations[invitation_id] = replace(found, grant_spent_at=None)

    def grants(self, user_id: str, sign_public_key: bytes) -> list[DeviceGrant]:
        key = b64e(sign_public_key)
        return [DeviceGrant(i.id, i.platform, dict(i.minimums), i.used_at, i.grant_spent_at)
                for i in sorted(self._tx.state.invitations.values(), key=lambda i: i.used_at or i.created_at)
                if i.user_id == user_id and i.sign_public_key == key and i.used_at is not None]

    def spend(self, invitation_id: str, now: datetime) -> bool:
        found = self._tx.state.invitations.get(invitation_id)
        if found is None or found.used_at is None or found.grant_spent_at is not None:
            return False
        self._tx.state.invitations[invitation_id] = replace(found, grant_spent_at=now)
        return True


class FakeAgentUnitOfWork(_Transaction):
    """One transaction and the agent's stores."""

    def __init__(self, store: FakeAgentStore) -> None:
        super().__init__(store)
        self.users = _Users(self)
        self.nonces = _Nonces(self)
        self.sessions = _Sessions(self)
        self.leases = _Leases(self)
        self.revocations = _Revocations(self)
        self.handoffs = _Handoffs(self)
        self.pending_revocations = _Pending(self)
        self.invitations = _Invitations(self)

    def __enter__(self) -> FakeAgentUnitOfWork:
        return self


class FakeAgentRequest(_Transaction):
    """One message's write transaction: the lock taken at once."""

    def __init__(self, store: FakeAgentStore) -> None:
        super().__init__(store)
        _ = self.state  # begun now
        self._users, self._nonces, self._sessions = _Users(self), _Nonces(self), _Sessions(self)
        self._leases, self._revocations = _Leases(self), _Revocations(self)
        self._invitations = _Invitations(self)

    def find_user(self, user_id: str) -> EnrolledUser | None:
        return self._users.find(user_id)

    def claim_nonce(self, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
        return self._nonces.claim(scope, sender, nonce, expires_at)

    def is_revoked(self, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        return self._revocations.revoked(user_id, sign_public_key, host_id)

    def held_sessions(self, host_id: str, user_id: str) -> tuple[int, int]:
        held = [s for s in self.state.sessions.values() if s.host_id == host_id and s.user_id == user_id
                and s.protection == "esp" and s.state == AgentSessionState.ACTIVE.value]
        devices = sum(1 for s in held if s.platform is not None)
        return devices, len(held) - devices

    def revocation_pending(self, user_id: str, target_id: str) -> bool:
        return (target_id, user_id) in self.state.pending

    def leased_addresses(self) -> set[str]:
        return self._leases.taken()

    def take_lease(self, address: str, ticket: str) -> bool:
        return self._leases.take(address, ticket)

    def add_session(self, session: AgentSession) -> None:
        self._sessions.add(session)

    def session(self, ticket: str) -> AgentSession | None:
        return self._sessions.get(ticket)

    def finish_session(self, ticket: str, state: AgentSessionState, reason: str) -> bool:
        return self._sessions.finish(ticket, state, reason)

    def release_lease(self, ticket: str) -> None:
        self._leases.release(ticket)

    def device_grants(self, user_id: str, sign_public_key: bytes) -> list[DeviceGrant]:
        return self._invitations.grants(user_id, sign_public_key)

    def spend_grant(self, invitation_id: str, now: datetime) -> bool:
        return self._invitations.spend(invitation_id, now)

    def __enter__(self) -> FakeAgentRequest:
        return self
