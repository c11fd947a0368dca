"""tunnel listing index: tunnels are listed a page at a time in creation order

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_tunnels_created_at_id", "tunnels", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_tunnels_created_at_id", table_name="tunnels")
