"""tunnels to unmanaged peers: responder may be empty, the peer's address and identities

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tunnels", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("peer", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                      nullable=True)
        )
        batch_op.alter_column("responder", existing_type=sa.String(length=64), nullable=True)


def downgrade() -> None:
    # Peer tunnels have no responder gateway: they cannot be kept in the older schema.
    op.execute(sa.text("DELETE FROM tunnels WHERE responder IS NULL"))
    with op.batch_alter_table("tunnels", schema=None) as batch_op:
        batch_op.alter_column("responder", existing_type=sa.String(length=64), nullable=False)
        batch_op.drop_column("peer")
