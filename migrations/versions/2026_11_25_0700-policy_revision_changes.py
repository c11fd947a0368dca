"""one revision shape: policy revisions store their per-field changes, as rating-table revisions do

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 07:00:00

The data step fills ``changes`` of every existing policy revision with its differences from
the revision before (none for the first), as they were shown until now.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(sa.dialects.postgresql.JSONB(), "postgresql")


def _diff(old: dict[str, Any] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-field changes between two policy documents (frozen here: later releases may diff otherwise)."""
    if old is None:
        return []
    return [{"field": key, "old": old.get(key), "new": new.get(key)}
            for key in sorted({*old, *new}) if old.get(key) != new.get(key)]


def upgrade() -> None:
    with op.batch_alter_table("policy_revisions") as batch:
        batch.add_column(sa.Column("changes", _JSON, nullable=True))
    revisions = sa.table("policy_revisions", sa.column("id", sa.Integer), sa.column("policy_id", sa.Integer),
                         sa.column("revision", sa.Integer), sa.column("content", _JSON),
                         sa.column("changes", _JSON))
    bind = op.get_bind()
    rows = bind.execute(sa.select(revisions.c.id, revisions.c.policy_id, revisions.c.content)
                        .order_by(revisions.c.policy_id, revisions.c.revision)).all()
    previous: dict[int, dict[str, Any]] = {}
    for row_id, policy_id, content in rows:
        bind.execute(revisions.update().where(revisions.c.id == row_id)
                     .values(changes=_diff(previous.get(policy_id), content)))
        previous[policy_id] = content
    with op.batch_alter_table("policy_revisions") as batch:
        batch.alter_column("changes", existing_type=_JSON, nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("policy_revisions") as batch:
        batch.drop_column("changes")
