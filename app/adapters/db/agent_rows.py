"""The tunnel agent's tables.

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
from typing import Any

from sqlalchemy import Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from app.adapters.db.models import Base, Json, UtcDateTime, utcnow

__all__ = [
    "AgentHandoffRow",
    "AgentInvitationRow",
    "AgentLeaseRow",
    "AgentNonceRow",
    "AgentPendingRevocationRow",
    "AgentRevocationRow",
    "AgentSessionRow",
    "AgentUserRow",
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
