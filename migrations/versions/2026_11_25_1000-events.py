"""events: what happened, in order, for the live event stream (GET /v1/events)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(sa.dialects.postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("scope", sa.String(length=32), nullable=True),
        sa.Column("data", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sqlite_autoincrement=True,  # an id is never given twice, even after a prune
    )
    op.create_index(op.f("ix_events_at"), "events", ["at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_events_at"), table_name="events")
    op.drop_table("events")
