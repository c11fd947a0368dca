"""console sessions: the hash of each session id, its token, when it ends

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 11:00:00

A row per signed-in browser of the admin console (``/ui``). Only the SHA-256 of the session
id is stored; a session ends at ``expires_at``, or at once when its token is revoked or
expires (checked on every request), and goes with its token if that is ever deleted.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("token_id", sa.String(12), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], name=op.f("fk_ui_sessions_token_id_api_tokens"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_ui_sessions")),
    )
    op.create_index(op.f("ix_ui_sessions_token_id"), "ui_sessions", ["token_id"])
    op.create_index(op.f("ix_ui_sessions_expires_at"), "ui_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_ui_sessions_expires_at"), table_name="ui_sessions")
    op.drop_index(op.f("ix_ui_sessions_token_id"), table_name="ui_sessions")
    op.drop_table("ui_sessions")
