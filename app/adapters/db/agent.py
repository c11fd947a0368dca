"""The tunnel agent's repositories: its tables (:mod:`app.adapters.db.agent_rows`) through a
SQLAlchemy Session, the hot functions (:mod:`app.adapters.db.agent_hot`) in the Session's
transaction."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.agent_hot import (
    add_session,
    enrolled_user,
    find_user,
    is_revoked,
    leased_addresses,
    take_lease,
)
from app.adapters.db.agent_rows import (
    AgentHandoffRow,
    AgentInvitationRow,
    AgentLeaseRow,
    AgentNonceRow,
    AgentPendingRevocationRow,
    AgentRevocationRow,
    AgentSessionRow,
    AgentUserRow,
)
from app.adapters.db.hot import session_cursor, session_insert_new
from app.adapters.db.models import utcnow
from app.domain.agent import AgentSessionState, EnrolledUser, b64d, b64e
from app.domain.agent.ports import AgentSession, Invitation, PendingRevocation, RevocationRecord, WaitingHandoff
from app.domain.errors import AlreadyExists, NotFound

__all__ = [
    "HandoffRepository",
    "InvitationRepository",
    "LeaseRepository",
    "NonceRepository",
    "PendingRevocationRepository",
    "RevocationRepository",
    "SessionRepository",
    "UserRepository",
]


def _user(row: AgentUserRow) -> EnrolledUser:
    return enrolled_user(row.user_id, row.sign_public_key, row.kem_public_key, row.objectives, row.revoked_at,
                     row.mlkem_public_key)


class UserRepository:
    """Enrolled users (Host)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def enroll(self, user: EnrolledUser) -> None:
        """Enrol a new user, or re-enrol a revoked one with new keys.

        Raises:
            AlreadyExists: an active user of that id exists.
        """
        row = self.session.get(AgentUserRow, user.user_id)
        if row is not None and row.revoked_at is None:
            raise AlreadyExists(f"user {user.user_id} is enrolled already")
        if row is None:
            row = AgentUserRow(user_id=user.user_id)
            self.session.add(row)
        row.sign_public_key = b64e(user.sign_public_key)
        row.kem_public_key = b64e(user.kem_public_key)
        row.mlkem_public_key = b64e(user.mlkem_public_key) if user.mlkem_public_key is not None else None
        row.objectives = sorted(user.objectives)
        row.revoked_at = None
        row.created_at = utcnow()
        try:
            self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"user {user.user_id} is enrolled already") from exc

    def find(self, user_id: str) -> EnrolledUser | None:
        """The user's record."""
        with session_cursor(self.session) as cursor:
            return find_user(cursor, user_id)

    def all(self) -> list[tuple[EnrolledUser, datetime, datetime | None]]:
        rows = self.session.scalars(select(AgentUserRow).order_by(AgentUserRow.user_id)).all()
        return [(_user(r), r.created_at, r.revoked_at) for r in rows]

    def revoke(self, user_id: str) -> bool:
        """Mark revoked; False if it was already.

        Raises:
            NotFound: no such user.
        """
        row = self.session.get(AgentUserRow, user_id)
        if row is None:
            raise NotFound(f"no user {user_id}")
        if row.revoked_at is not None:
            return False
        row.revoked_at = utcnow()
        self.session.flush()
        return True


class NonceRepository:
    """The replay cache (Host and Target, each in its own scope)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def claim(self, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
        """Insert (scope, sender, nonce); False if it is there already (a replay)."""
        return session_insert_new(self.session, AgentNonceRow,
                           {"scope": scope, "sender": sender, "nonce": nonce.hex(), "expires_at": expires_at})

    def purge(self, now: datetime) -> int:
        """Forget nonces whose timestamps can no longer pass the freshness check."""
        result = self.session.execute(delete(AgentNonceRow).where(AgentNonceRow.expires_at < now))
        return int(getattr(result, "rowcount", 0) or 0)


def _session(row: AgentSessionRow) -> AgentSession:
    return AgentSession(
        ticket=row.ticket, user_id=row.user_id, host_id=row.host_id, request_id=row.request_id,
        objective_id=row.objective_id, protection=row.protection, conn=row.conn, pool=row.pool,
        virtual_ip=row.virtual_ip, client_identity=row.client_identity, suite=row.suite, state=row.state,
        expires_at=row.expires_at, reason=row.reason, created_at=row.created_at, updated_at=row.updated_at,
        provenance=row.provenance, platform=row.platform)


class SessionRepository:
    """Target's sessions (tickets)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, row: AgentSession) -> None:
        """Insert a new session.

        Raises:
            AlreadyExists: the ticket exists (tickets are single-use).
        """
        with session_cursor(self.session) as cursor:
            add_session(cursor, row)

    def get(self, ticket: str) -> AgentSession | None:
        row = self.session.get(AgentSessionRow, ticket)
        return None if row is None else _session(row)

    def select(self, *, state: AgentSessionState | None = None, user_id: str | None = None,
               limit: int = 1000) -> list[AgentSession]:
        q = select(AgentSessionRow).order_by(AgentSessionRow.created_at.desc()).limit(limit)
        if state is not None:
            q = q.where(AgentSessionRow.state == state.value)
        if user_id is not None:
            q = q.where(AgentSessionRow.user_id == user_id)
        return [_session(r) for r in self.session.scalars(q)]

    def expired(self, now: datetime) -> list[AgentSession]:
        return [_session(r) for r in self.session.scalars(
            select(AgentSessionRow).where(AgentSessionRow.state == AgentSessionState.ACTIVE.value,
                                          AgentSessionRow.expires_at <= now))]

    def finish(self, ticket: str, state: AgentSessionState, reason: str) -> bool:
        """Move an active session to ``state``; False if it was not active (single use)."""
        result = self.session.execute(
            update(AgentSessionRow)
            .where(AgentSessionRow.ticket == ticket, AgentSessionRow.state == AgentSessionState.ACTIVE.value)
            .values(state=state.value, reason=reason[:200], updated_at=utcnow())
        )
        return int(getattr(result, "rowcount", 0) or 0) == 1


class HandoffRepository:
    """Host's profiles waiting for their one-time download."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, *, digest: str, user_id: str, profile_name: str, media_type: str, profile: bytes,
            expires_at: datetime) -> None:
        self.session.add(AgentHandoffRow(digest=digest, user_id=user_id, profile_name=profile_name,
                                         media_type=media_type, profile=profile, expires_at=expires_at))
        self.session.flush()

    def take(self, digest: str, now: datetime) -> WaitingHandoff | None:
        """Delete and return it in one statement: two fetches of one link never both get it."""
        row = self.session.execute(
            delete(AgentHandoffRow).where(AgentHandoffRow.digest == digest, AgentHandoffRow.expires_at > now)
            .returning(AgentHandoffRow.user_id, AgentHandoffRow.profile_name, AgentHandoffRow.media_type,
                       AgentHandoffRow.profile)).first()
        return None if row is None else WaitingHandoff(row[0], row[1], row[2], bytes(row[3]))

    def forget_user(self, user_id: str) -> int:
        result = self.session.execute(delete(AgentHandoffRow).where(AgentHandoffRow.user_id == user_id))
        return int(getattr(result, "rowcount", 0) or 0)

    def purge(self, now: datetime) -> int:
        result = self.session.execute(delete(AgentHandoffRow).where(AgentHandoffRow.expires_at <= now))
        return int(getattr(result, "rowcount", 0) or 0)


def _invitation(row: AgentInvitationRow) -> Invitation:
    return Invitation(id=row.id, digest=row.digest, user_id=row.user_id, platform=row.platform,
                      objectives=tuple(row.objectives), minimums=dict(row.minimums), created_by=row.created_by,
                      created_at=row.created_at, expires_at=row.expires_at, used_at=row.used_at,
                      revoked_at=row.revoked_at, sign_public_key=row.sign_public_key,
                      grant_spent_at=row.grant_spent_at)


class InvitationRepository:
    """Host's one-time invitations."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, invitation: Invitation) -> None:
        self.session.add(AgentInvitationRow(
            id=invitation.id, digest=invitation.digest, user_id=invitation.user_id, platform=invitation.platform,
            objectives=list(invitation.objectives), minimums=dict(invitation.minimums),
            created_by=invitation.created_by, created_at=invitation.created_at, expires_at=invitation.expires_at))
        self.session.flush()

    def by_digest(self, digest: str) -> Invitation | None:
        row = self.session.scalars(select(AgentInvitationRow).where(AgentInvitationRow.digest == digest)).first()
        return None if row is None else _invitation(row)

    def get(self, invitation_id: str) -> Invitation | None:
        row = self.session.get(AgentInvitationRow, invitation_id)
        return None if row is None else _invitation(row)

    def select(self, *, user_id: str | None = None, limit: int = 100) -> list[Invitation]:
        query = select(AgentInvitationRow).order_by(AgentInvitationRow.created_at.desc(), AgentInvitationRow.id)
        if user_id is not None:
            query = query.where(AgentInvitationRow.user_id == user_id)
        return [_invitation(r) for r in self.session.scalars(query.limit(limit))]

    def redeem(self, invitation_id: str, *, sign_public_key: str, now: datetime) -> bool:
        result = self.session.execute(update(AgentInvitationRow).where(
            AgentInvitationRow.id == invitation_id, AgentInvitationRow.used_at.is_(None),
            AgentInvitationRow.revoked_at.is_(None), AgentInvitationRow.expires_at > now,
        ).values(used_at=now, sign_public_key=sign_public_key).execution_options(synchronize_session=False))
        return int(getattr(result, "rowcount", 0) or 0) == 1

    def revoke(self, invitation_id: str, now: datetime) -> bool:
        result = self.session.execute(update(AgentInvitationRow).where(
            AgentInvitationRow.id == invitation_id, AgentInvitationRow.used_at.is_(None),
            AgentInvitationRow.revoked_at.is_(None),
        ).values(revoked_at=now).execution_options(synchronize_session=False))
        return int(getattr(result, "rowcount", 0) or 0) == 1

    def invited(self, user_id: str, sign_public_key: str) -> bool:
        return bool(self.session.scalar(select(exists().where(
            AgentInvitationRow.user_id == user_id, AgentInvitationRow.sign_public_key == sign_public_key))))

    def withdraw_user(self, user_id: str, now: datetime) -> int:
        result = self.session.execute(update(AgentInvitationRow).where(
            AgentInvitationRow.user_id == user_id, AgentInvitationRow.used_at.is_(None),
            AgentInvitationRow.revoked_at.is_(None),
        ).values(revoked_at=now).execution_options(synchronize_session=False))
        return int(getattr(result, "rowcount", 0) or 0)

    def restore_grant(self, invitation_id: str) -> None:
        self.session.execute(update(AgentInvitationRow).where(AgentInvitationRow.id == invitation_id)
                             .values(grant_spent_at=None).execution_options(synchronize_session=False))


class RevocationRepository:
    """Target's revocation list: the (Host, user, signing key) it no longer accepts."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, *, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        """Record a revocation; False if it was recorded already."""
        return session_insert_new(self.session, AgentRevocationRow, {
            "user_id": user_id, "sign_public_key": b64e(sign_public_key), "host_id": host_id, "revoked_at": utcnow()})

    def revoked(self, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
        """Whether ``host_id`` revoked this user's key."""
        with session_cursor(self.session) as cursor:
            return is_revoked(cursor, user_id, sign_public_key, host_id)

    def all(self, limit: int | None = None) -> list[RevocationRecord]:
        """Newest first (at most ``limit``)."""
        return [RevocationRecord(user_id=r.user_id, sign_public_key=r.sign_public_key, host_id=r.host_id,
                                 revoked_at=r.revoked_at)
                for r in self.session.scalars(
                    select(AgentRevocationRow).order_by(AgentRevocationRow.revoked_at.desc()).limit(limit))]


def _pending(row: AgentPendingRevocationRow) -> PendingRevocation:
    return PendingRevocation(target_id=row.target_id, user_id=row.user_id,
                             sign_public_key=b64d(row.sign_public_key, size=32), attempts=row.attempts,
                             next_attempt_at=row.next_attempt_at, last_error=row.last_error,
                             created_at=row.created_at)


class PendingRevocationRepository:
    """Host's revocations a Target has not confirmed yet (one per target and user)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, *, target_id: str, user_id: str, sign_public_key: bytes, now: datetime) -> None:
        """Keep the revocation of ``user_id`` for ``target_id``, due at ``now`` (one kept already is
        replaced: the key is the user's latest)."""
        row = self.session.get(AgentPendingRevocationRow, (target_id, user_id))
        if row is None:
            row = AgentPendingRevocationRow(target_id=target_id, user_id=user_id, created_at=now)
            self.session.add(row)
        row.sign_public_key = b64e(sign_public_key)
        row.attempts, row.next_attempt_at, row.last_error = 0, now, ""
        self.session.flush()

    def due(self, now: datetime, limit: int = 100) -> list[PendingRevocation]:
        """Those whose next attempt is due at ``now``, the most overdue first."""
        return [_pending(r) for r in self.session.scalars(
            select(AgentPendingRevocationRow).where(AgentPendingRevocationRow.next_attempt_at <= now)
            .order_by(AgentPendingRevocationRow.next_attempt_at).limit(limit))]

    def of_user(self, user_id: str) -> list[PendingRevocation]:
        """Those of ``user_id``, by target."""
        return [_pending(r) for r in self.session.scalars(
            select(AgentPendingRevocationRow).where(AgentPendingRevocationRow.user_id == user_id)
            .order_by(AgentPendingRevocationRow.target_id))]

    def confirm(self, target_id: str, user_id: str, sign_public_key: bytes) -> bool:
        """The Target confirmed the revocation of that key: forgotten (False: none kept, or one
        kept for a newer key)."""
        result = self.session.execute(delete(AgentPendingRevocationRow).where(
            AgentPendingRevocationRow.target_id == target_id, AgentPendingRevocationRow.user_id == user_id,
            AgentPendingRevocationRow.sign_public_key == b64e(sign_public_key)))
        return int(getattr(result, "rowcount", 0) or 0) == 1

    def postpone(self, target_id: str, user_id: str, *, attempts: int, next_attempt_at: datetime,
                 error: str) -> None:
        """``attempts`` made (the last failing with ``error``), the next one due at ``next_attempt_at``."""
        self.session.execute(update(AgentPendingRevocationRow).where(
            AgentPendingRevocationRow.target_id == target_id, AgentPendingRevocationRow.user_id == user_id,
        ).values(attempts=attempts, next_attempt_at=next_attempt_at, last_error=error[:200]))

    def forget(self, target_id: str, user_id: str) -> None:
        """Give up on one (its target is no longer configured)."""
        self.session.execute(delete(AgentPendingRevocationRow).where(
            AgentPendingRevocationRow.target_id == target_id, AgentPendingRevocationRow.user_id == user_id))


class LeaseRepository:
    """Virtual-IP leases (Target)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def taken(self) -> set[str]:
        with session_cursor(self.session) as cursor:
            return leased_addresses(cursor)

    def take(self, address: str, ticket: str) -> bool:
        """Lease ``address`` to ``ticket``; False if someone else has it."""
        with session_cursor(self.session) as cursor:
            return take_lease(cursor, address, ticket)

    def release(self, ticket: str) -> None:
        self.session.execute(delete(AgentLeaseRow).where(AgentLeaseRow.ticket == ticket))
