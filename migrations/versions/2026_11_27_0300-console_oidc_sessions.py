"""console sessions of the identity provider's users: who, their scopes, the mapping they were given under

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 03:00:00

A console session is either an API token's (``token_id``, as before) or, signed in with the
organisation's OpenID provider, a user's: ``subject`` (the provider's ``sub``), ``user_name``
(what the console and the audit log call them), ``scopes`` (what the mapping gave them) and
``mapping_hash`` (the fingerprint of the issuer, client and mapping they were given under: a
session whose mapping has changed since is refused). A check keeps each row one kind or the
other. Sessions made before are tokens' sessions.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ONE_KIND = ("(token_id IS NOT NULL AND subject IS NULL AND scopes IS NULL AND mapping_hash IS NULL) OR "
             "(token_id IS NULL AND subject IS NOT NULL AND user_name IS NOT NULL AND scopes IS NOT NULL "
             "AND mapping_hash IS NOT NULL)")


def upgrade() -> None:
    with op.batch_alter_table("ui_sessions") as batch:
        batch.alter_column("token_id", existing_type=sa.String(12), nullable=True)
        batch.add_column(sa.Column("subject", sa.String(255), nullable=True))
        batch.add_column(sa.Column("user_name", sa.String(64), nullable=True))
        batch.add_column(sa.Column(
            "scopes", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=True))
        batch.add_column(sa.Column("mapping_hash", sa.String(64), nullable=True))
        batch.create_check_constraint(op.f("ck_ui_sessions_one_kind"), _ONE_KIND)


def downgrade() -> None:
    op.execute("DELETE FROM ui_sessions WHERE token_id IS NULL")
    with op.batch_alter_table("ui_sessions") as batch:
        batch.drop_constraint(op.f("ck_ui_sessions_one_kind"), type_="check")
        batch.drop_column("mapping_hash")
        batch.drop_column("scopes")
        batch.drop_column("user_name")
        batch.drop_column("subject")
        batch.alter_column("token_id", existing_type=sa.String(12), nullable=False)
