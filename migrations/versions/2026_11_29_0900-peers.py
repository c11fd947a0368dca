"""peers: other qoss services this one negotiates tunnels with, and the nonces of their messages

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-29 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "peers",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("url", sa.String(255), nullable=False),
        sa.Column("sign_key", sa.String(64), nullable=False),
        sa.Column("kem_key", sa.String(64), nullable=False),
        sa.Column("gateways", _JSON, nullable=False),
        sa.Column("networks", _JSON, nullable=False),
        sa.Column("min_levels", _JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "peer_nonces",
        sa.Column("peer", sa.String(63), primary_key=True),
        sa.Column("nonce", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_peer_nonces_expires_at", "peer_nonces", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_peer_nonces_expires_at", table_name="peer_nonces")
    op.drop_table("peer_nonces")
    op.drop_table("peers")
