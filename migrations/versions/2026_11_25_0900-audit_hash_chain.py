"""the audit log as a hash chain: prev_hash and hash on every entry, the chain's head

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 09:00:00

The data step chains the entries already there, in id order, with the chain's first hash
(SHA-256 of the canonical JSON of every column but ``hash``, kept here as it was defined when
this revision was written: a migration never changes with the code), and records the head;
so an upgraded database verifies. It reads and updates 1,000 entries at a time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PAGE = 1000
_GENESIS = "0" * 64
_HASHED = ("action", "at", "client_request_id", "detail", "id", "object", "outcome", "prev_hash", "request_id",
           "scopes", "source", "token_id", "token_name")
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def _entry_hash(entry: Mapping[str, Any]) -> str:
    fields = {name: entry[name] for name in _HASHED}
    at: datetime = fields["at"]
    if at.tzinfo is None:  # SQLite gives back the naive UTC it stores
        at = at.replace(tzinfo=UTC)
    fields["at"] = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    fields["scopes"] = list(fields["scopes"])
    data = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return hashlib.sha256(data).hexdigest()


def upgrade() -> None:
    op.create_table(
        "audit_chain_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("last_id", sa.Integer(), nullable=True),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_audit_chain_head_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_chain_head")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prev_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("hash", sa.String(length=64), nullable=True))
    last_id, last_hash = _chain_existing_entries()
    op.bulk_insert(
        sa.table("audit_chain_head", sa.column("id", sa.Integer()), sa.column("last_id", sa.Integer()),
                 sa.column("hash", sa.String())),
        [{"id": 1, "last_id": last_id, "hash": last_hash}],
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.alter_column("prev_hash", existing_type=sa.String(length=64), nullable=False)
        batch_op.alter_column("hash", existing_type=sa.String(length=64), nullable=False)
        batch_op.create_unique_constraint(batch_op.f("uq_audit_events_prev_hash"), ["prev_hash"])


def _chain_existing_entries() -> tuple[int | None, str]:
    conn = op.get_bind()
    names = ("id", "request_id", "client_request_id", "token_id", "token_name", "source", "action", "object",
             "outcome", "detail")
    events = sa.table("audit_events", *(sa.column(n) for n in names),
                      sa.column("at", sa.DateTime(timezone=True)),
                      sa.column("scopes", _JSON), sa.column("prev_hash", sa.String()), sa.column("hash", sa.String()))
    update = (events.update().where(events.c.id == sa.bindparam("b_id"))
              .values(prev_hash=sa.bindparam("b_prev_hash"), hash=sa.bindparam("b_hash")))
    last_id: int | None = None
    prev_hash = _GENESIS
    while True:
        query = sa.select(*(events.c[n] for n in (*names, "at", "scopes"))).order_by(events.c.id).limit(_PAGE)
        if last_id is not None:
            query = query.where(events.c.id > last_id)
        page = [dict(row._mapping) for row in conn.execute(query)]
        if not page:
            return last_id, prev_hash
        changes = []
        for entry in page:
            entry["prev_hash"] = prev_hash
            prev_hash = _entry_hash(entry)
            changes.append({"b_id": entry["id"], "b_prev_hash": entry["prev_hash"], "b_hash": prev_hash})
        conn.execute(update, changes)
        last_id = page[-1]["id"]


def downgrade() -> None:
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_audit_events_prev_hash"), type_="unique")
        batch_op.drop_column("hash")
        batch_op.drop_column("prev_hash")
    op.drop_table("audit_chain_head")
