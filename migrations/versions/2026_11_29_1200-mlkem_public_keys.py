"""ML-KEM-768 public keys: an enrolled user's and a peer's, beside their X25519 keys (messages
that carry a post-quantum preshared key are sealed to both)

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: 1,184 bytes in unpadded base64url.
_KEY = 1579


def upgrade() -> None:
    op.add_column("agent_users", sa.Column("mlkem_public_key", sa.String(_KEY), nullable=True))
    op.add_column("peers", sa.Column("mlkem_key", sa.String(_KEY), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("peers") as batch:
        batch.drop_column("mlkem_key")
    with op.batch_alter_table("agent_users") as batch:
        batch.drop_column("mlkem_public_key")
