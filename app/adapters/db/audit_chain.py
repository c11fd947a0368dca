"""The audit log's hash chain in the database: every append links to the chain's head, one at a time.

Appending (:func:`append`, :func:`append_in`), inside the caller's write transaction:

1. lock and read the head, the one row of ``audit_chain_head`` (``SELECT ... FOR UPDATE`` on
   PostgreSQL: a second appender waits here until the first commits or rolls back, then
   reads the head that one left, READ COMMITTED reading the newest row version). SQLite has
   one writer at a time: qoss opens write transactions with ``BEGIN IMMEDIATE``
   (:func:`~app.adapters.db.engine.make_engine`, :class:`~app.adapters.db.hot.HotTransaction`),
   so the head read is the head; a deferred transaction whose snapshot is older than the
   last commit cannot write at all (``SQLITE_BUSY_SNAPSHOT``), so it cannot fork the chain;
2. take the ids after the head's (PostgreSQL: from the table's sequence, under the lock, so
   chain order is id order; SQLite: after the largest id and the head's, never re-using the
   id of a removed last entry);
3. hash and insert the entries (:func:`app.domain.audit_chain.link`), and move the head.

The lock is taken when the audit record is written, which for a request's own record is
its transaction's commit (:mod:`app.services.audit`), and held until that commit. The
unique ``prev_hash`` makes a fork impossible even so: a second entry after the same
predecessor is refused by the database.

Reading (:func:`entries`, :func:`head`) streams in id order, constant memory.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Integer, Table, bindparam, column, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ClauseElement

from app.adapters.db.hot import HotCursor, HotStatement, session_cursor
from app.adapters.db.models import AuditChainHeadRow, AuditRow, EventRow, utcnow
from app.domain.audit_chain import GENESIS, ChainHead, link

__all__ = ["append", "append_in", "entries", "head", "lock_in", "snapshot"]

log = logging.getLogger("qoss.audit")

_AUDIT = cast(Table, AuditRow.__table__)
_HEAD = cast(Table, AuditChainHeadRow.__table__)
_DEFAULTS: dict[str, Any] = {"token_id": None, "token_name": None, "client_request_id": None, "detail": ""}

_LOCK_HEAD = HotStatement(lambda _: select(_HEAD.c.last_id, _HEAD.c.hash).where(_HEAD.c.id == 1).with_for_update())
_LAST = HotStatement(lambda _: select(_AUDIT.c.id, _AUDIT.c.hash).order_by(_AUDIT.c.id.desc()).limit(1))
#: SQLite: the head and the largest id in one statement (each statement of a write
#: transaction is time the one writer holds the database).
_HEAD_AND_MAX = HotStatement(lambda _: select(_HEAD.c.last_id, _HEAD.c.hash, select(func.max(_AUDIT.c.id))
                                              .scalar_subquery()).where(_HEAD.c.id == 1))
_NEXT_IDS = HotStatement(lambda _: text(
    "SELECT nextval(pg_get_serial_sequence('audit_events', 'id')) FROM generate_series(1, :n)",
).bindparams(bindparam("n", type_=Integer)).columns(column("id", Integer)))
_SETVAL = HotStatement(lambda _: text(
    "SELECT setval(pg_get_serial_sequence('audit_events', 'id'), :value)",
).bindparams(bindparam("value", type_=Integer)).columns(column("id", Integer)))
#: One entry, every column a bind of its own name (the id included: taken under the lock).
_EVENTS = cast(Table, EventRow.__table__)
#: Each audit entry is also an event of the live stream (``audit``, for ``audit:read``).
_INSERT_EVENT = HotStatement(lambda _: insert(EventRow).values(
    {c.name: bindparam(c.name, type_=c.type) for c in _EVENTS.c if c.name != "id"}))
_INSERT = HotStatement(lambda _: insert(AuditRow).values({c.name: bindparam(c.name, type_=c.type) for c in _AUDIT.c}))
_SET_HEAD = HotStatement(lambda _: update(_HEAD).where(_HEAD.c.id == 1).values(
    last_id=bindparam("last_id", type_=Integer), hash=bindparam("hash", type_=_HEAD.c.hash.type)))


def _make_head(dialect: str) -> ClauseElement:
    values = {"id": 1, "last_id": bindparam("last_id", type_=Integer),
              "hash": bindparam("hash", type_=_HEAD.c.hash.type)}
    if dialect == "postgresql":
        return pg_insert(_HEAD).values(values).on_conflict_do_nothing()
    return sqlite_insert(_HEAD).values(values).on_conflict_do_nothing()


_MAKE_HEAD = HotStatement(_make_head)


def append(cursor: HotCursor, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Append ``records`` to the chain in the cursor's (write) transaction; the entries as written.

    Each record gives every column but ``id``, ``prev_hash`` and ``hash`` (``at`` defaults to
    now; ``token_id``, ``token_name``, ``client_request_id`` to None; ``detail`` to empty).
    """
    if not records:
        return []
    now = utcnow()
    rows = [{**_DEFAULTS, **r, "at": r.get("at") or now, "scopes": list(r["scopes"])} for r in records]
    sqlite = cursor.dialect.name == "sqlite"
    read_head = _HEAD_AND_MAX if sqlite else _LOCK_HEAD
    found = cursor.first(read_head, {})
    if found is None:  # the head row is made by the migration; someone removed it
        last = cursor.first(_LAST, {})
        log.warning("the audit chain head was missing: made again from the last entry (%s)", last and last[0])
        cursor.execute(_MAKE_HEAD, {"last_id": last[0] if last else None, "hash": last[1] if last else GENESIS})
        found = cursor.first(read_head, {})
        assert found is not None
    last_id, prev_hash = found[0], found[1]
    if sqlite:  # after the largest id and the head's: never the id of a removed last entry
        base = max(int(found[2] or 0), last_id or 0)
        ids = list(range(base + 1, base + len(rows) + 1))
    else:
        ids = _ids(cursor, len(rows), last_id)
    linked = link(rows, ids=ids, prev_hash=prev_hash)
    cursor.execute_many(_INSERT, linked)
    cursor.execute_many(_INSERT_EVENT, [
        {"at": r["at"], "kind": "audit", "subject": str(r["id"]), "scope": "audit:read",
         "data": {k: r[k] for k in ("id", "action", "object", "outcome", "token_name", "source", "detail")}}
        for r in linked])
    cursor.execute(_SET_HEAD, {"last_id": linked[-1]["id"], "hash": linked[-1]["hash"]})
    return linked


def _ids(cursor: HotCursor, n: int, last_id: int | None) -> list[int]:
    """``n`` increasing ids after ``last_id``, taken while the head is locked (PostgreSQL)."""
    ids = sorted(int(r[0]) for r in cursor.all(_NEXT_IDS, {"n": n}))
    if last_id is not None and ids[0] <= last_id:  # the sequence was set back: move it past the head
        cursor.first(_SETVAL, {"value": last_id})
        ids = sorted(int(r[0]) for r in cursor.all(_NEXT_IDS, {"n": n}))
    return ids


def append_in(session: Session, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """:func:`append` in ``session``'s transaction. The session's pending changes are flushed
    first, so the chain's lock is never held while they wait for locks of their own."""
    if not records:
        return []
    session.flush()
    with session_cursor(session) as cursor:
        return append(cursor, records)


def lock_in(session: Session) -> None:
    """Take the chain's lock in ``session``'s transaction until it ends (PostgreSQL; a SQLite
    write transaction holds the database's one write lock already). The event log takes it
    too, so that events, like audit entries, get their ids in the order they commit."""
    session.flush()
    if session.get_bind().dialect.name == "sqlite":
        return  # its write transaction (BEGIN IMMEDIATE) excludes every other writer already
    with session_cursor(session) as cursor:
        cursor.first(_LOCK_HEAD, {})


def snapshot(session: Session) -> None:
    """Make ``session``'s reads one snapshot (PostgreSQL: REPEATABLE READ; a SQLite read
    transaction is one already). Call before the session's first statement."""
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def head(session: Session) -> ChainHead | None:
    """The recorded head of the chain (None if the row is missing)."""
    row = session.execute(select(_HEAD.c.last_id, _HEAD.c.hash).where(_HEAD.c.id == 1)).first()
    return None if row is None else ChainHead(row.last_id, row.hash)


def entries(
    session: Session, *, after: int | None = None, before: int | None = None, limit: int | None = None,
) -> Generator[dict[str, Any], None, None]:
    """Entries in id order (every column), streamed: ids above ``after`` and below ``before``, at most
    ``limit``. Close the iterator if you stop early (``contextlib.closing``)."""
    query = select(*_AUDIT.c).order_by(_AUDIT.c.id)
    if after is not None:
        query = query.where(_AUDIT.c.id > after)
    if before is not None:
        query = query.where(_AUDIT.c.id < before)
    if limit is not None:
        query = query.limit(limit)
    result = session.execute(query, execution_options={"yield_per": 1000})  # PostgreSQL: a server-side cursor
    try:
        for row in result:
            yield dict(row._mapping)
    finally:
        result.close()
