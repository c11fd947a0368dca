"""ORM models. The schema is created only by the Alembic migrations in ``migrations/``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "Base",
    "GatewayRow",
    "PolicyRevisionRow",
    "PolicyRow",
    "RatingTableRevisionRow",
    "RatingTableRow",
    "TunnelRow",
    "utcnow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

Json = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RatingTableRow(Base):
    __tablename__ = "rating_tables"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    current_revision: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RatingTableRevisionRow(Base):
    __tablename__ = "rating_table_revisions"
    __table_args__ = (UniqueConstraint("table_id", "revision", name="uq_rating_table_revisions_table_revision"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("rating_tables.id", ondelete="CASCADE"), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    author: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    content: Mapped[dict[str, Any]] = mapped_column(Json)
    changes: Mapped[list[dict[str, Any]]] = mapped_column(Json)


class PolicyRow(Base):
    __tablename__ = "policies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    current_revision: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PolicyRevisionRow(Base):
    __tablename__ = "policy_revisions"
    __table_args__ = (UniqueConstraint("policy_id", "revision", name="uq_policy_revisions_policy_revision"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id", ondelete="CASCADE"), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    author: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    content: Mapped[dict[str, Any]] = mapped_column(Json)


class GatewayRow(Base):
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
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TunnelRow(Base):
    __tablename__ = "tunnels"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    initiator: Mapped[str] = mapped_column(String(64), index=True)
    responder: Mapped[str] = mapped_column(String(64), index=True)
    local_ts: Mapped[list[str]] = mapped_column(Json)
    remote_ts: Mapped[list[str]] = mapped_column(Json)
    state: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")
    negotiation: Mapped[dict[str, Any]] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
