"""shipped data loads once (shipped_loads), per-database keys (server_keys), the client's request id in the audit

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 09:00:00

The data step: a database the previous releases already started (it holds rating tables,
policies or audit records) had every shipped table and policy offered to it at each start,
so all of them count as loaded, and so does any name whose first revision was written by
the loader or whose deletion the audit log holds. Only an empty database gets the shipped
data at its next start.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: What the releases before this one shipped (``ratings/``, ``policies/``), frozen here: the data step
#: must not change when later releases ship more.
_SHIPPED: dict[str, tuple[str, ...]] = {
    "rating_table": ("esaf-2006", "standards-2026"),
    "policy": ("bulk-backup", "high-security", "integrity-only", "mobile-default", "voip"),
}
#: Where each kind lives: (table, revision table, its foreign key, the API path of one object).
_KINDS = {
    "rating_table": ("rating_tables", "rating_table_revisions", "table_id", "/v1/rating-tables/"),
    "policy": ("policies", "policy_revisions", "policy_id", "/v1/policies/"),
}


def upgrade() -> None:
    op.create_table(
        "shipped_loads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shipped_loads")),
        sa.UniqueConstraint("kind", "name", name="uq_shipped_loads_kind_name"),
    )
    op.create_table(
        "server_keys",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_server_keys")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("client_request_id", sa.String(length=64), nullable=True))
    _record_what_was_loaded()


def _record_what_was_loaded() -> None:
    conn = op.get_bind()
    started = any(
        conn.execute(sa.text(f"SELECT 1 FROM {table} LIMIT 1")).first() is not None  # noqa: S608 - fixed names
        for table in ("rating_tables", "policies", "audit_events")
    )
    if not started:
        return
    loaded: set[tuple[str, str]] = {(kind, name) for kind, names in _SHIPPED.items() for name in names}
    for kind, (table, revisions, owner, path) in _KINDS.items():
        by_loader = conn.execute(sa.text(
            f"SELECT t.name FROM {table} t JOIN {revisions} r ON r.{owner} = t.id "  # noqa: S608 - fixed names
            "WHERE r.revision = 1 AND r.author = 'shipped'"))
        loaded |= {(kind, name) for (name,) in by_loader}
        deleted = conn.execute(sa.text(
            "SELECT object FROM audit_events WHERE action = 'DELETE' AND outcome >= 200 AND outcome < 300 "
            "AND object LIKE :prefix"), {"prefix": path + "%"})
        for (obj,) in deleted:
            name = obj.removeprefix(path)
            if name and "/" not in name and len(name) <= 64:
                loaded.add((kind, name))
    now = datetime.now(UTC)
    if conn.dialect.name == "sqlite":  # stored as naive UTC there (UtcDateTime)
        now = now.replace(tzinfo=None)
    shipped_loads = sa.table("shipped_loads", sa.column("kind", sa.String()), sa.column("name", sa.String()),
                             sa.column("loaded_at", sa.DateTime(timezone=True)))
    op.bulk_insert(shipped_loads, [{"kind": kind, "name": name, "loaded_at": now} for kind, name in sorted(loaded)])


def downgrade() -> None:
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_column("client_request_id")
    op.drop_table("server_keys")
    op.drop_table("shipped_loads")
