"""peer_teardowns: teardowns a peer did not hear, told again until it answers

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-29 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "peer_teardowns",
        sa.Column("peer", sa.String(63), primary_key=True),
        sa.Column("tunnel_id", sa.String(40), primary_key=True),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_peer_teardowns_next_at", "peer_teardowns", ["next_at"])


def downgrade() -> None:
    op.drop_index("ix_peer_teardowns_next_at", table_name="peer_teardowns")
    op.drop_table("peer_teardowns")
