"""agent session platform: a session that is a device enrolment names the platform of its VPN client

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 00:00:00

Sessions made before are clients' sessions (no platform).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent_sessions") as batch:
        batch.add_column(sa.Column("platform", sa.String(24), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_column("platform")
