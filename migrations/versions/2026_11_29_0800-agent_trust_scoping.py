"""tunnel agent: revocations scoped by (Host, user, key); Host's revocations not yet confirmed

Target's revocation list is keyed on the Host that sent a revocation as well as the user and
the key: a Host's revocation bars only that Host's user. Host keeps each revocation a Target
has not confirmed, to send it again until it does.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

def _revocations(name: str, key: list[str]) -> None:
    op.create_table(
        name,
        sa.Column("host_id", sa.String(length=63), nullable=False),
        sa.Column("user_id", sa.String(length=63), nullable=False),
        sa.Column("sign_public_key", sa.String(length=43), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(*key, name=op.f("pk_agent_revocations")),
    )


def _rekey(key: list[str]) -> None:
    """The revocation list again under primary key ``key`` (a new table, its rows copied over)."""
    op.rename_table("agent_revocations", "agent_revocations_old")
    if op.get_bind().dialect.name == "postgresql":  # its constraint kept its name through the rename
        op.execute("ALTER TABLE agent_revocations_old RENAME CONSTRAINT pk_agent_revocations "
                   "TO pk_agent_revocations_old")
    _revocations("agent_revocations", key)
    op.execute("INSERT INTO agent_revocations (host_id, user_id, sign_public_key, revoked_at) "
               "SELECT host_id, user_id, sign_public_key, revoked_at FROM agent_revocations_old")
    op.drop_table("agent_revocations_old")


def upgrade() -> None:
    _rekey(["host_id", "user_id", "sign_public_key"])
    op.create_table(
        "agent_pending_revocations",
        sa.Column("target_id", sa.String(length=63), nullable=False),
        sa.Column("user_id", sa.String(length=63), nullable=False),
        sa.Column("sign_public_key", sa.String(length=43), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("target_id", "user_id", name=op.f("pk_agent_pending_revocations")),
    )
    op.create_index("ix_agent_pending_revocations_next_attempt_at", "agent_pending_revocations",
                    ["next_attempt_at"])
    op.create_index("ix_agent_sessions_host_id_user_id", "agent_sessions", ["host_id", "user_id"])


def downgrade() -> None:
    op.drop_index("ix_agent_sessions_host_id_user_id", table_name="agent_sessions")
    op.drop_index("ix_agent_pending_revocations_next_attempt_at", table_name="agent_pending_revocations")
    op.drop_table("agent_pending_revocations")
    # Two Hosts' revocations of one (user, key) become one row: the earliest is kept.
    op.execute("DELETE FROM agent_revocations WHERE EXISTS (SELECT 1 FROM agent_revocations AS o "
               "WHERE o.user_id = agent_revocations.user_id AND o.sign_public_key = agent_revocations.sign_public_key "
               "AND (o.revoked_at < agent_revocations.revoked_at OR (o.revoked_at = agent_revocations.revoked_at "
               "AND o.host_id < agent_revocations.host_id)))")
    _rekey(["user_id", "sign_public_key"])
