"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22 11:15:01.524301
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "gateways",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("vici_socket", sa.String(length=200), nullable=False),
        sa.Column("ike_address", sa.String(length=64), nullable=False),
        sa.Column("identity", sa.String(length=128), nullable=False),
        sa.Column(
            "inside_networks",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.Column("version", sa.String(length=128), nullable=True),
        sa.Column(
            "algorithms", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gateways")),
        sa.UniqueConstraint("name", name=op.f("uq_gateways_name")),
    )
    op.create_table(
        "policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("current_revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policies")),
        sa.UniqueConstraint("name", name=op.f("uq_policies_name")),
    )
    op.create_table(
        "rating_tables",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("current_revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rating_tables")),
        sa.UniqueConstraint("name", name=op.f("uq_rating_tables_name")),
    )
    op.create_table(
        "tunnels",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("initiator", sa.String(length=64), nullable=False),
        sa.Column("responder", sa.String(length=64), nullable=False),
        sa.Column(
            "local_ts", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column(
            "remote_ts", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column(
            "negotiation", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tunnels")),
    )
    with op.batch_alter_table("tunnels", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tunnels_initiator"), ["initiator"], unique=False)
        batch_op.create_index(batch_op.f("ix_tunnels_responder"), ["responder"], unique=False)

    op.create_table(
        "policy_revisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("policy_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "content", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["policy_id"], ["policies.id"], name=op.f("fk_policy_revisions_policy_id_policies"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_revisions")),
        sa.UniqueConstraint("policy_id", "revision", name="uq_policy_revisions_policy_revision"),
    )
    with op.batch_alter_table("policy_revisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_policy_revisions_policy_id"), ["policy_id"], unique=False)

    op.create_table(
        "rating_table_revisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "content", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column(
            "changes", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["rating_tables.id"],
            name=op.f("fk_rating_table_revisions_table_id_rating_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rating_table_revisions")),
        sa.UniqueConstraint("table_id", "revision", name="uq_rating_table_revisions_table_revision"),
    )
    with op.batch_alter_table("rating_table_revisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rating_table_revisions_table_id"), ["table_id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("rating_table_revisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rating_table_revisions_table_id"))

    op.drop_table("rating_table_revisions")
    with op.batch_alter_table("policy_revisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_policy_revisions_policy_id"))

    op.drop_table("policy_revisions")
    with op.batch_alter_table("tunnels", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tunnels_responder"))
        batch_op.drop_index(batch_op.f("ix_tunnels_initiator"))

    op.drop_table("tunnels")
    op.drop_table("rating_tables")
    op.drop_table("policies")
    op.drop_table("gateways")
