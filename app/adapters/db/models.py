"""ORM models. The schema is created only by the Alembic migrations in ``migrations/``.

Constraint and index names follow :data:`NAMING_CONVENTION`, so migrations can name
(and later drop or alter) every one of them on SQLite and PostgreSQL alike. Times are
timezone-aware UTC. JSON columns are ``JSON`` on SQLite and ``JSONB`` on PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "NAMING_CONVENTION",
    "AuditChainHeadRow",
    "AuditRow",
    "Base",
    "EventRow",
    "GatewayRow",
    "IdempotencyRow",
    "Json",
    "PeerNonceRow",
    "PeerRow",
    "PolicyRevisionRow",
    "PolicyRow",
    "RateBucketRow",
    "RatingTableRevisionRow",
    "RatingTableRow",
    "ServerKeyRow",
    "ShippedLoadRow",
    "TunnelRow",
    "UiSessionRow",
    "UtcDateTime",
    "utcnow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: JSON on SQLite, JSONB on PostgreSQL.
Json = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that always gives back timezone-aware UTC.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so the value is stored
    as UTC and read back with ``tzinfo=UTC``. Naive datetimes are refused on the way in.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC; refuse a naive datetime (its zone would be a guess)."""
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: give a timezone-aware one")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Timezone-aware UTC, whatever the database gave back."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base whose metadata names every constraint and index."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class _Document:
    """A named document: its name and which revision is current (the compare-and-set target)."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    current_revision: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class _Revision:
    """One revision of a document: the whole document and its changes against the one before."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    revision: Mapped[int] = mapped_column(Integer)
    author: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    content: Mapped[dict[str, Any]] = mapped_column(Json)
    changes: Mapped[list[dict[str, Any]]] = mapped_column(Json)


class RatingTableRow(_Document, Base):
    """A rating table."""

    __tablename__ = "rating_tables"


class RatingTableRevisionRow(_Revision, Base):
    """One revision of a rating table: ``RatingTable.as_dict()``, changes per algorithm and field."""

    __tablename__ = "rating_table_revisions"
    __table_args__ = (UniqueConstraint("table_id", "revision", name="uq_rating_table_revisions_table_revision"),)

    table_id: Mapped[int] = mapped_column(ForeignKey("rating_tables.id", ondelete="CASCADE"), index=True)


class PolicyRow(_Document, Base):
    """A policy."""

    __tablename__ = "policies"


class PolicyRevisionRow(_Revision, Base):
    """One revision of a policy: ``Policy.as_dict()``, changes per field."""

    __tablename__ = "policy_revisions"
    __table_args__ = (UniqueConstraint("policy_id", "revision", name="uq_policy_revisions_policy_revision"),)

    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id", ondelete="CASCADE"), index=True)


class GatewayRow(Base):
    """A strongSwan gateway qoss drives, with what was last read from it."""

    __tablename__ = "gateways"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    vici_socket: Mapped[str] = mapped_column(String(200))
    ike_address: Mapped[str] = mapped_column(String(64))
    identity: Mapped[str] = mapped_column(String(128))
    inside_networks: Mapped[list[str]] = mapped_column(Json)
    backend: Mapped[str | None] = mapped_column(String(64), nullable=True)
    version: Mapped[str | None] = mapped_column(String(128), nullable=True)
    algorithms: Mapped[list[str]] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class TunnelRow(Base):
    """A tunnel record (never the PSK)."""

    __tablename__ = "tunnels"
    #: Listings page in creation order (``GET /v1/tunnels?cursor=``).
    __table_args__ = (Index("ix_tunnels_created_at_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    initiator: Mapped[str] = mapped_column(String(64), index=True)
    responder: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)
    #: An unmanaged far end ({address, identity, local_identity}); never its PSK.
    peer: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    local_ts: Mapped[list[str]] = mapped_column(Json)
    remote_ts: Mapped[list[str]] = mapped_column(Json)
    state: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")
    negotiation: Mapped[dict[str, Any]] = mapped_column(Json)
    #: What it was negotiated under (``TunnelRecord.provenance``); never a PSK.
    provenance: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ApiTokenRow(Base):
    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(Json)
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class UiSessionRow(Base):
    """A console session: the SHA-256 of its id (never the id), when it ends, and whose it is: an
    API token's, or a user's signed in with the identity provider (their subject, name, scopes
    and the fingerprint of the mapping that gave them those)."""

    __tablename__ = "ui_sessions"
    __table_args__ = (CheckConstraint(
        "(token_id IS NOT NULL AND subject IS NULL AND scopes IS NULL AND mapping_hash IS NULL) OR "
        "(token_id IS NULL AND subject IS NOT NULL AND user_name IS NOT NULL AND scopes IS NOT NULL "
        "AND mapping_hash IS NOT NULL)", name="one_kind"),)

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str | None] = mapped_column(
        String(12), ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    subject: Mapped[str | None] = mapped_column(String(255), nullable=True)
    user_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    scopes: Mapped[list[str] | None] = mapped_column(Json, nullable=True)
    mapping_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)


class AuditRow(Base):
    """Append-only: one row per state change or security decision. Never key material."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    #: Ours, made per request (the ``X-Request-ID`` the service answers with).
    request_id: Mapped[str] = mapped_column(String(64))
    #: The client's own ``X-Request-ID``, if it sent a well-formed one: kept, never trusted.
    client_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    token_id: Mapped[str | None] = mapped_column(String(12), nullable=True)
    token_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    scopes: Mapped[list[str]] = mapped_column(Json)
    source: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(16))
    object: Mapped[str] = mapped_column(String(300))
    outcome: Mapped[int] = mapped_column(Integer)
    detail: Mapped[str] = mapped_column(String(200), default="")
    #: The hash chain (app.domain.audit_chain): the previous entry's ``hash`` (unique: the
    #: chain cannot fork), and SHA-256 over this entry's other columns.
    prev_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hash: Mapped[str] = mapped_column(String(64))


class AuditChainHeadRow(Base):
    """One row (id 1): where the audit chain ends, updated with every append (its lock serialises appends).

    A chain whose last entry is not this one lost entries at its end (``qoss audit verify``).
    """

    __tablename__ = "audit_chain_head"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    last_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    hash: Mapped[str] = mapped_column(String(64))


class IdempotencyRow(Base):
    """A POST's answer by (token, Idempotency-Key), so a retry returns it instead of acting twice."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("token_id", "key", name="uq_idempotency_keys_token_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_id: Mapped[str] = mapped_column(String(12))
    key: Mapped[str] = mapped_column(String(128))
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ShippedLoadRow(Base):
    """A shipped rating table or policy offered to this database once: never loaded again by itself.

    ``kind`` is ``rating_table`` or ``policy``. An operator who deletes a shipped one keeps it
    deleted; ``qoss ratings import --shipped NAME`` (``qoss policies import --shipped NAME``)
    brings it back on purpose.
    """

    __tablename__ = "shipped_loads"
    __table_args__ = (UniqueConstraint("kind", "name", name="uq_shipped_loads_kind_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(64))
    loaded_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ServerKeyRow(Base):
    """A random key of this database, made once and never sent anywhere (e.g. ``idempotency``:
    the HMAC key that fingerprints a request's secrets)."""

    __tablename__ = "server_keys"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class EventRow(Base):
    """One thing that happened, for the live event stream (``GET /v1/events``): written in the
    transaction of the change it tells of, so a committed change always has its event.

    ``scope``: the scope a token needs to see it (None: any valid token).
    """

    __tablename__ = "events"
    #: Ids are never given twice (SQLite reuses the largest after a delete without this):
    #: a client resuming after event N must not miss a new event numbered N or lower.
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(String(40))
    subject: Mapped[str] = mapped_column(String(200))
    scope: Mapped[str | None] = mapped_column(String(32), nullable=True)
    data: Mapped[dict[str, Any]] = mapped_column(Json)


class RateBucketRow(Base):
    """A rate limit's token bucket shared by the replicas on PostgreSQL: ``tokens`` left at
    ``at``, whether the last request was let through (``spent``), full again at ``full_at``
    (after which the row means nothing and is removed)."""

    __tablename__ = "rate_buckets"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    full_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    spent: Mapped[bool] = mapped_column(Boolean)


class PeerRow(Base):
    """Another qoss this one negotiates tunnels with (``app.domain.peering.Peer``): its public
    keys only, never a private one."""

    __tablename__ = "peers"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    url: Mapped[str] = mapped_column(String(255))
    sign_key: Mapped[str] = mapped_column(String(64))
    kem_key: Mapped[str] = mapped_column(String(64))
    #: ML-KEM-768 (base64url); none for a peer that registered none.
    mlkem_key: Mapped[str | None] = mapped_column(String(1579), nullable=True)
    gateways: Mapped[list[str]] = mapped_column(Json)
    networks: Mapped[list[str]] = mapped_column(Json)
    min_levels: Mapped[dict[str, int]] = mapped_column(Json)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class PeerTeardownRow(Base):
    """A teardown a peer did not hear, to be told again (``app.domain.peering.UnheardTeardown``)."""

    __tablename__ = "peer_teardowns"

    peer: Mapped[str] = mapped_column(String(63), primary_key=True)
    tunnel_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    reason: Mapped[str] = mapped_column(String(200))
    first_at: Mapped[datetime] = mapped_column(UtcDateTime)
    attempts: Mapped[int] = mapped_column(Integer)
    next_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)


class PeerNonceRow(Base):
    """A nonce a peer's message carried, kept until the message could no longer be fresh: a
    message seen again is a replay."""

    __tablename__ = "peer_nonces"

    peer: Mapped[str] = mapped_column(String(63), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
