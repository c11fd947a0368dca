"""agent handoffs: device profiles waiting at Host for their one-time download link

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_handoffs",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(63), nullable=False),
        sa.Column("profile_name", sa.String(80), nullable=False),
        sa.Column("media_type", sa.String(80), nullable=False),
        sa.Column("profile", sa.LargeBinary(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_agent_handoffs_expires_at", "agent_handoffs", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_agent_handoffs_expires_at", table_name="agent_handoffs")
    op.drop_table("agent_handoffs")
