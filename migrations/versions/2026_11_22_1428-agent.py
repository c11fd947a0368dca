"""tunnel agent: users, replay cache, sessions, leases

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-22 14:28:10.954225
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "agent_leases",
        sa.Column("address", sa.String(length=45), nullable=False),
        sa.Column("ticket", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("address", name=op.f("pk_agent_leases")),
        sa.UniqueConstraint("ticket", name=op.f("uq_agent_leases_ticket")),
    )
    op.create_table(
        "agent_nonces",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("sender", sa.String(length=63), nullable=False),
        sa.Column("nonce", sa.String(length=32), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "sender", "nonce", name=op.f("pk_agent_nonces")),
    )
    with op.batch_alter_table("agent_nonces", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_agent_nonces_expires_at"), ["expires_at"], unique=False)

    op.create_table(
        "agent_sessions",
        sa.Column("ticket", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=63), nullable=False),
        sa.Column("host_id", sa.String(length=63), nullable=False),
        sa.Column("request_id", sa.String(length=32), nullable=False),
        sa.Column("objective_id", sa.Integer(), nullable=False),
        sa.Column("protection", sa.String(length=16), nullable=False),
        sa.Column("conn", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=True),
        sa.Column("virtual_ip", sa.String(length=45), nullable=True),
        sa.Column("client_identity", sa.String(length=128), nullable=False),
        sa.Column(
            "suite", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=200), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("ticket", name=op.f("pk_agent_sessions")),
    )
    with op.batch_alter_table("agent_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_agent_sessions_expires_at"), ["expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_agent_sessions_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_agent_sessions_user_id"), ["user_id"], unique=False)

    op.create_table(
        "agent_users",
        sa.Column("user_id", sa.String(length=63), nullable=False),
        sa.Column("sign_public_key", sa.String(length=43), nullable=False),
        sa.Column("kem_public_key", sa.String(length=43), nullable=False),
        sa.Column(
            "objectives", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_agent_users")),
    )


def downgrade() -> None:

    op.drop_table("agent_users")
    with op.batch_alter_table("agent_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_agent_sessions_user_id"))
        batch_op.drop_index(batch_op.f("ix_agent_sessions_state"))
        batch_op.drop_index(batch_op.f("ix_agent_sessions_expires_at"))

    op.drop_table("agent_sessions")
    with op.batch_alter_table("agent_nonces", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_agent_nonces_expires_at"))

    op.drop_table("agent_nonces")
    op.drop_table("agent_leases")
