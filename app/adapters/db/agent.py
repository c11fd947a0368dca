"""The tunnel agent's tables and repositories.

Host keeps the enrolled users and the revocations a Target has not confirmed yet; Host and
Target keep the replay cache (a unique row per (scope, sender, nonce): the atomic insert that
makes a replay fail across workers and restarts); Target keeps the sessions it set up
(tickets, single-use, with expiry), the virtual-IP leases it handed out (a unique row per
address) and its own record of the revocations Hosts sent it (Host, user and revoked signing
key: a Host's revocation bars only that Host's user). No key material is ever stored: only
public keys.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from app.adapters.db.hot import HotCursor, HotStatement, insert_new, session_cursor, session_insert_new
from app.adapters.db.models import Base, Json, UtcDateTime, utcnow
from app.domain.agent import MLKEM_PUBLIC_BYTES, AgentSessionState, EnrolledUser, b64d, b64e
from app.domain.agent.ports import (
    AgentSession,
    DeviceGrant,
    Invitation,
    PendingRevocation,
    RevocationRecord,
    WaitingHandoff,
)
from app.domain.errors import AlreadyExists, NotFound

__all__ = [
    "AgentInvitationRow",
    "AgentLeaseRow",
    "AgentNonceRow",
    "AgentPendingRevocationRow",
    "AgentRevocationRow",
    "AgentSessionRow",
    "AgentUserRow",
    "InvitationRepository",
    "LeaseRepository",
    "NonceRepository",
    "PendingRevocationRepository",
    "RevocationRepository",
    "SessionRepository",
    "UserRepository",
    "add_session",
    "claim_nonce",
    "device_grants",
    "find_user",
    "finish_session",
    "get_session",
    "held_sessions",
    "is_revoked",
    "leased_addresses",
    "release_leases",
    "revocation_pending",
    "spend_grant",
    "take_lease",
]


class AgentUserRow(Base):
    """A user enrolled at Host: public keys and the Objective-IDs they may ask for."""

    __tablename__ = "agent_users"

    user_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    sign_public_key: Mapped[str] = mapped_column(String(43))
    kem_public_key: Mapped[str] = mapped_column(String(43))
    objectives: Mapped[list[int]] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    #: ML-KEM-768 (base64url); none for keys made without one.
    mlkem_public_key: Mapped[str | None] = mapped_column(String(1579), nullable=True)


class AgentNonceRow(Base):
    """Replay cache: one row per (scope, sender, nonce) until it expires."""

    __tablename__ = "agent_nonces"

    scope: Mapped[str] = mapped_column(String(16), primary_key=True)
    sender: Mapped[str] = mapped_column(String(63), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(32), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)


class AgentSessionRow(Base):
    """A tunnel Target set up for a client (its ticket), until closed, expired or revoked."""

    __tablename__ = "agent_sessions"
    __table_args__ = (Index("ix_agent_sessions_host_id_user_id", "host_id", "user_id"),)

    ticket: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(63), index=True)
    host_id: Mapped[str] = mapped_column(String(63))
    request_id: Mapped[str] = mapped_column(String(32))
    objective_id: Mapped[int] = mapped_column(Integer)
    protection: Mapped[str] = mapped_column(String(16))
    conn: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    virtual_ip: Mapped[str | None] = mapped_column(String(45), nullable=True)
    client_identity: Mapped[str] = mapped_column(String(128))
    suite: Mapped[dict[str, Any]] = mapped_column(Json)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(String(200), default="")
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)
    #: What the session was negotiated under (None: made before it was kept).
    provenance: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    #: A device enrolment: the platform whose VPN client holds its profile (None: a client's session).
    platform: Mapped[str | None] = mapped_column(String(24), nullable=True)


class AgentLeaseRow(Base):
    """A virtual IP handed to one session's client (unique: two sessions never share one)."""

    __tablename__ = "agent_leases"

    address: Mapped[str] = mapped_column(String(45), primary_key=True)
    ticket: Mapped[str] = mapped_column(String(32), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class AgentRevocationRow(Base):
    """Target's own record of a revoked user key: that Host's endorsements of that user with that
    key are refused (another Host's user of the same id is another user)."""

    __tablename__ = "agent_revocations"

    host_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    sign_public_key: Mapped[str] = mapped_column(String(43), primary_key=True)
    revoked_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class AgentPendingRevocationRow(Base):
    """Host's revocation of a user that a Target has not confirmed yet: sent again until it is."""

    __tablename__ = "agent_pending_revocations"

    target_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(63), primary_key=True)
    sign_public_key: Mapped[str] = mapped_column(String(43))
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    last_error: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class AgentHandoffRow(Base):
    """A device's profile waiting at Host to be fetched once from a link (by the link secret's SHA-256)."""

    __tablename__ = "agent_handoffs"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(63))
    profile_name: Mapped[str] = mapped_column(String(80))
    media_type: Mapped[str] = mapped_column(String(80))
    profile: Mapped[bytes] = mapped_column(LargeBinary)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)


class AgentInvitationRow(Base):
    """A one-time invitation at Host (by its secret's SHA-256), the keys that redeemed it and the
    device enrolment it granted them."""

    __tablename__ = "agent_invitations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[str] = mapped_column(String(63), index=True)
    platform: Mapped[str] = mapped_column(String(24))
    objectives: Mapped[list[int]] = mapped_column(Json)
    minimums: Mapped[dict[str, int]] = mapped_column(Json)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    used_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    sign_public_key: Mapped[str | None] = mapped_column(String(43), nullable=True)
    grant_spent_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


def _enrolled(user_id: str, sign: str, kem: str, objectives: list[int], revoked_at: datetime | None,
              mlkem: str | None) -> EnrolledUser:
    return EnrolledUser(user_id=user_id, sign_public_key=b64d(sign, size=32), kem_public_key=b64d(kem, size=32),
                        objectives=frozenset(objectives), revoked=revoked_at is not None,
                        mlkem_public_key=b64d(mlkem, size=MLKEM_PUBLIC_BYTES) if mlkem is not None else None)


def _user(row: AgentUserRow) -> EnrolledUser:
    return _enrolled(row.user_id, row.sign_public_key, row.kem_public_key, row.objectives, row.revoked_at,
                     row.mlkem_public_key)


_USERS = cast(Table, AgentUserRow.__table__)
_FIND_USER = HotStatement(lambda _: select(
    _USERS.c.user_id, _USERS.c.sign_public_key, _USERS.c.kem_public_key, _USERS.c.objectives, _USERS.c.revoked_at,
    _USERS.c.mlkem_public_key,
).where(_USERS.c.user_id == bindparam("user_id")))


def find_user(cursor: HotCursor, user_id: str) -> EnrolledUser | None:
    """The user's record (one hot query: no ORM object on the path of every request)."""
    row = cursor.first(_FIND_USER, {"user_id": user_id})
    return None if row is None else _enrolled(*row)


def claim_nonce(cursor: HotCursor, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
    """Insert (scope, sender, nonce) into the replay cache; False if it is there already (a replay)."""
    return insert_new(cursor, AgentNonceRow, {"scope": scope, "sender": sender, "nonce": nonce.hex(),
                                              "expires_at": expires_at})


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


_SESSIONS = cast(Table, AgentSessionRow.__table__)
_LEASES = cast(Table, AgentLeaseRow.__table__)
_ADD_SESSION = HotStatement(lambda _: insert(_SESSIONS))  # every column, each a bind of its own name


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


_REVOKED = HotStatement(lambda _: select(exists().where(AgentRevocationRow.host_id == bindparam("host_id"),
                                                         AgentRevocationRow.user_id == bindparam("user_id"),
                                                         AgentRevocationRow.sign_public_key == bindparam("key"))))


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


# --------------------------------------------------------------------------- hot functions
# Target's connect runs these in one hot transaction (app/adapters/db/hot.py); the
# repositories above run them in a Session's transaction.


def add_session(cursor: HotCursor, row: AgentSession) -> None:
    """Insert a new session: one hot INSERT of every column (``updated_at``: its creation).

    Raises:
        AlreadyExists: the ticket exists (tickets are single-use). No savepoint: a clash of
            random 128-bit tickets fails the transaction.
    """
    values = {c.key: getattr(row, c.key) for c in _SESSIONS.columns}
    values["reason"] = values["reason"] or ""
    values["updated_at"] = values["updated_at"] or values["created_at"]
    try:
        cursor.execute(_ADD_SESSION, values)
    except IntegrityError as exc:
        raise AlreadyExists("ticket exists") from exc


_GET_SESSION = HotStatement(lambda _: select(*_SESSIONS.c).where(_SESSIONS.c.ticket == bindparam("ticket")))
_FINISH_SESSION = HotStatement(lambda _: update(_SESSIONS).where(  # no bind named as a column: see update()
    _SESSIONS.c.ticket == bindparam("which"), _SESSIONS.c.state == AgentSessionState.ACTIVE.value,
).values(state=bindparam("new_state"), reason=bindparam("new_reason"), updated_at=bindparam("now")))
_RELEASE_LEASES = HotStatement(lambda _: delete(_LEASES).where(_LEASES.c.ticket == bindparam("ticket")))


def get_session(cursor: HotCursor, ticket: str) -> AgentSession | None:
    """The session of ``ticket``, or None (one hot query)."""
    row = cursor.first(_GET_SESSION, {"ticket": ticket})
    return None if row is None else AgentSession(**dict(zip(_SESSIONS.c.keys(), row, strict=True)))


def finish_session(cursor: HotCursor, ticket: str, state: AgentSessionState, reason: str) -> bool:
    """Move an active session to ``state``; False if it was not active (single use)."""
    return cursor.execute(_FINISH_SESSION, {"which": ticket, "new_state": state.value,
                                            "new_reason": reason[:200], "now": utcnow()}) == 1


def release_leases(cursor: HotCursor, ticket: str) -> None:
    """Let go of the address leased to ``ticket`` (none: nothing happens)."""
    cursor.execute(_RELEASE_LEASES, {"ticket": ticket})


def is_revoked(cursor: HotCursor, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
    """Whether Target's revocation list has this user's signing key, revoked by ``host_id``."""
    row = cursor.first(_REVOKED, {"host_id": host_id, "user_id": user_id, "key": b64e(sign_public_key)})
    return bool(row and row[0])


_HELD = HotStatement(lambda _: select(func.count(_SESSIONS.c.platform), func.count()).select_from(_SESSIONS).where(
    _SESSIONS.c.host_id == bindparam("host_id"), _SESSIONS.c.user_id == bindparam("user_id"),
    _SESSIONS.c.state == AgentSessionState.ACTIVE.value, _SESSIONS.c.protection == "esp"))
#: PostgreSQL: a lock on one (Host, user) until the transaction ends; SQLite's write transaction
#: (``BEGIN IMMEDIATE``) holds every other writer off already.
_HOLD_USER = HotStatement(lambda dialect: select(
    func.pg_advisory_xact_lock(func.hashtext(bindparam("key"))) if dialect == "postgresql" else literal(1)))


def held_sessions(cursor: HotCursor, host_id: str, user_id: str) -> tuple[int, int]:
    """The addresses ``host_id``'s user ``user_id`` holds: (devices enrolled and not revoked,
    tunnels up), both active ESP sessions. The pair stays locked until the transaction ends, so two
    requests of one user count one after the other, on PostgreSQL as on SQLite."""
    cursor.first(_HOLD_USER, {"key": f"qoss-agent-user {host_id} {user_id}"})
    row = cursor.first(_HELD, {"host_id": host_id, "user_id": user_id})
    devices, sessions = (int(row[0]), int(row[1])) if row else (0, 0)
    return devices, sessions - devices


_PENDINGS = cast(Table, AgentPendingRevocationRow.__table__)
_PENDING = HotStatement(lambda _: select(exists().where(_PENDINGS.c.target_id == bindparam("target_id"),
                                                        _PENDINGS.c.user_id == bindparam("user_id"))))


def revocation_pending(cursor: HotCursor, user_id: str, target_id: str) -> bool:
    """Whether Host still waits for ``target_id`` to confirm the revocation of ``user_id``."""
    row = cursor.first(_PENDING, {"target_id": target_id, "user_id": user_id})
    return bool(row and row[0])


_LEASED = HotStatement(lambda _: select(_LEASES.c.address))


def leased_addresses(cursor: HotCursor) -> set[str]:
    """Every virtual IP leased now."""
    return {row[0] for row in cursor.all(_LEASED, {})}


def take_lease(cursor: HotCursor, address: str, ticket: str) -> bool:
    """Lease ``address`` to ``ticket``; False if someone else has it."""
    return insert_new(cursor, AgentLeaseRow, {"address": address, "ticket": ticket, "created_at": utcnow()})


_INVITATIONS = cast(Table, AgentInvitationRow.__table__)
_GRANTS = HotStatement(lambda _: select(
    _INVITATIONS.c.id, _INVITATIONS.c.platform, _INVITATIONS.c.minimums, _INVITATIONS.c.used_at,
    _INVITATIONS.c.grant_spent_at,
).where(_INVITATIONS.c.user_id == bindparam("user_id"), _INVITATIONS.c.sign_public_key == bindparam("key"))
    .order_by(_INVITATIONS.c.used_at))
_SPEND_GRANT = HotStatement(lambda _: update(_INVITATIONS).where(  # no bind named as a column: see update()
    _INVITATIONS.c.id == bindparam("which"), _INVITATIONS.c.used_at.is_not(None),
    _INVITATIONS.c.grant_spent_at.is_(None),
).values(grant_spent_at=bindparam("now")))


def device_grants(cursor: HotCursor, user_id: str, sign_public_key: bytes) -> list[DeviceGrant]:
    """The device enrolments invitations granted to this user's signing key (one hot query on the
    invitations of one user; none for keys of the user's own)."""
    return [DeviceGrant(invitation_id=r[0], platform=r[1], minimums=dict(r[2]), granted_at=r[3], spent_at=r[4])
            for r in cursor.all(_GRANTS, {"user_id": user_id, "key": b64e(sign_public_key)})]


def spend_grant(cursor: HotCursor, invitation_id: str, now: datetime) -> bool:
    """Use an invitation's device enrolment; False if it was used already."""
    return cursor.execute(_SPEND_GRANT, {"which": invitation_id, "now": now}) == 1
