"""rate buckets: the rate limits' token buckets, shared by every replica on PostgreSQL

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 12:00:00

A row per limited key (a token, a client address, a user): the tokens left at ``at``,
whether the last request spent one (``spent``) or was refused, and ``full_at``, when the
bucket will be full again (past it the row means nothing and is removed). Written only by
replicas on PostgreSQL; a SQLite database (one process) keeps its buckets in memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_buckets",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("full_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spent", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_rate_buckets")),
    )
    op.create_index(op.f("ix_rate_buckets_full_at"), "rate_buckets", ["full_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_rate_buckets_full_at"), table_name="rate_buckets")
    op.drop_table("rate_buckets")
