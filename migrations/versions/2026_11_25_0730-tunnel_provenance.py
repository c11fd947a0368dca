"""tunnel provenance: what each tunnel was negotiated under, to negotiate it again after an edit

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 07:30:00

Tunnels made before have none: they are not moved by later edits (create them again to be).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(sa.dialects.postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("tunnels") as batch:
        batch.add_column(sa.Column("provenance", _JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tunnels") as batch:
        batch.drop_column("provenance")
