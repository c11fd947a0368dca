"""tunnel agent: Target's own revocation list (user and revoked signing key)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_revocations",
        sa.Column("user_id", sa.String(length=63), nullable=False),
        sa.Column("sign_public_key", sa.String(length=43), nullable=False),
        sa.Column("host_id", sa.String(length=63), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "sign_public_key", name=op.f("pk_agent_revocations")),
    )


def downgrade() -> None:
    op.drop_table("agent_revocations")
