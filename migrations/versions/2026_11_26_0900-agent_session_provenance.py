"""agent session provenance: what each agent session was negotiated under, to assess it after an edit

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 09:00:00

Sessions made before have none: they are listed as not assessed by an edit's dry run and are
not closed by edits; they follow edits from their next connect.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(sa.dialects.postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("agent_sessions") as batch:
        batch.add_column(sa.Column("provenance", _JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_column("provenance")
