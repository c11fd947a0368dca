"""agent invitations: one-time links that let a user's phone register its own keys at Host and
enrol one device

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "agent_invitations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(63), nullable=False),
        sa.Column("platform", sa.String(24), nullable=False),
        sa.Column("objectives", _JSON, nullable=False),
        sa.Column("minimums", _JSON, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sign_public_key", sa.String(43), nullable=True),
        sa.Column("grant_spent_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("digest", name=op.f("uq_agent_invitations_digest")),
    )
    op.create_index("ix_agent_invitations_user_id", "agent_invitations", ["user_id"])
    op.create_index("ix_agent_invitations_expires_at", "agent_invitations", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_agent_invitations_expires_at", table_name="agent_invitations")
    op.drop_index("ix_agent_invitations_user_id", table_name="agent_invitations")
    op.drop_table("agent_invitations")
