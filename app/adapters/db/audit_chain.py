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
3. hash and insert the entries (:func:`app.domain.audit_chain.link`, keyed with the audit key
   of the engine's :class:`ChainWriter`), and move the head.

The key is outside the database (:mod:`app.adapters.audit_seal`). A process's first append
(or its start-up, :meth:`ChainWriter.open`) checks it against the chain's last entry: a chain
empty or unkeyed so far gets a key (made if there is none); a keyed chain without the key,
or with another one, is refused with :class:`~app.adapters.audit_seal.AuditKeyError`.

Checkpoints: when an append's ids pass a multiple of ``audit_checkpoint_every``, and on the
first append of a chain that was unkeyed so far, the new end is written to the checkpoints
file once the transaction commits (never for a rollback). Every other append only hashes.

The lock is taken when the audit record is written, which for a request's own record is
its transaction's commit (:mod:`app.services.audit`), and held until that commit. The
unique ``prev_hash`` makes a fork impossible even so: a second entry after the same
predecessor is refused by the database.

Reading (:func:`entries`, :func:`head`) streams in id order, constant memory.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Generator, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Connection, Engine, Integer, Table, bindparam, column, event, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ClauseElement

from app.adapters.audit_seal import AuditKeyError, AuditSeal
from app.adapters.db.hot import HotCursor, HotStatement, session_cursor
from app.adapters.db.models import AuditChainHeadRow, AuditRow, EventRow, utcnow
from app.domain.audit_chain import GENESIS, ChainHead, ChainKey, Checkpoint, entry_hash, format_at, link

__all__ = ["INSERT_EVENT", "ChainWriter", "append", "append_in", "checkpoint_end", "entries", "head", "lock_in",
           "seal_engine", "snapshot", "writer_of"]

log = logging.getLogger("qoss.audit")

_AUDIT = cast(Table, AuditRow.__table__)
_HEAD = cast(Table, AuditChainHeadRow.__table__)
_DEFAULTS: dict[str, Any] = {"token_id": None, "token_name": None, "client_request_id": None, "detail": ""}

_LOCK_HEAD = HotStatement(lambda _: select(_HEAD.c.last_id, _HEAD.c.hash).where(_HEAD.c.id == 1).with_for_update())
_LAST = HotStatement(lambda _: select(_AUDIT.c.id, _AUDIT.c.hash).order_by(_AUDIT.c.id.desc()).limit(1))
_LAST_ENTRY = HotStatement(lambda _: select(*_AUDIT.c).order_by(_AUDIT.c.id.desc()).limit(1))
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
#: One event of the log (every column but the id); each audit entry is also one, of the live
#: stream (``audit``, for ``audit:read``).
INSERT_EVENT = HotStatement(lambda _: insert(EventRow).values(
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


class ChainWriter:
    """One process's writers of one database's chain: the key they hash with (known once
    :meth:`open` has checked it against the chain) and when they write a checkpoint."""

    def __init__(self, seal: AuditSeal) -> None:
        self.seal = seal
        self.key: ChainKey | None = None
        self._starts_keying = False
        self._marked: int | None = None
        self._lock = threading.Lock()

    def open(self, last: Mapping[str, Any] | None) -> ChainKey:
        """The key, checked (once) against the chain's ``last`` entry (None: the chain is empty).

        Raises:
            AuditKeyError: the chain is keyed and there is no key, or its last entry is keyed
                with another key (or altered).
        """
        with self._lock:
            if self.key is not None:
                return self.key
            key = self.seal.read_key()
            unkeyed = last is None or entry_hash(last) == last["hash"]
            if key is None:
                if not unkeyed:
                    assert last is not None
                    raise AuditKeyError(
                        f"the audit chain is keyed (its last entry, {last['id']}, has no unkeyed hash) but there is "
                        f"no audit key at {self.seal.key_location}: copy the key file of the replica that made it "
                        "(every replica needs the same one), or set QOSS_AUDIT_KEY_FILE")
                key = self.seal.make_key()
            elif not unkeyed:
                assert last is not None
                if entry_hash(last, key) != last["hash"]:
                    raise AuditKeyError(
                        f"the audit chain's last entry ({last['id']}) matches neither the audit key at "
                        f"{self.seal.key_location} nor a hash from before keying: every replica must use the same "
                        f"key file, or entry {last['id']} was altered (qoss audit verify)")
            self._starts_keying = unkeyed
            self.key = key
            return key

    def open_in(self, session: Session) -> ChainKey:
        """:meth:`open` with the chain's last entry read in ``session`` (start-up: a clear error early)."""
        if self.key is not None:
            return self.key
        return self.open(_last_entry(session))

    def due(self, before: int | None, linked: Sequence[Mapping[str, Any]]) -> Checkpoint | None:
        """The checkpoint to write once ``linked`` (appended after entry ``before``) commits, if one is due."""
        last = linked[-1]
        every = self.seal.checkpoint_every
        with self._lock:
            starts, self._starts_keying = self._starts_keying, False
        if starts or (before or 0) // every != int(last["id"]) // every:
            return Checkpoint(int(last["id"]), str(last["hash"]), format_at(utcnow()))
        return None

    def dropped(self) -> None:
        """A due checkpoint's entries were rolled back: if it was the first since keying began,
        the next append's is due instead."""
        with self._lock:
            if self._marked is None:
                self._starts_keying = True

    def write(self, checkpoint: Checkpoint) -> None:
        """Write a checkpoint of committed entries (a failure is logged: the entries stand)."""
        assert self.key is not None
        try:
            self.seal.write_checkpoint(checkpoint, self.key)
        except OSError:
            log.exception("the audit checkpoint of entry %d could not be written to %s", checkpoint.last_id,
                          self.seal.checkpoints_location)
            return
        with self._lock:
            self._marked = max(self._marked or 0, checkpoint.last_id)


_WRITERS: weakref.WeakKeyDictionary[Engine, ChainWriter] = weakref.WeakKeyDictionary()
_WRITERS_LOCK = threading.Lock()


def seal_engine(engine: Engine, seal: AuditSeal) -> ChainWriter:
    """Have the audit appends on ``engine`` keyed and checkpointed by ``seal``; its writer."""
    with _WRITERS_LOCK:
        writer = _WRITERS[engine] = ChainWriter(seal)
    return writer


def writer_of(bind: Engine | Connection) -> ChainWriter:
    """The writer :func:`seal_engine` gave the engine; else one for the environment's settings
    (``QOSS_STATE_DIR``, ``QOSS_AUDIT_KEY_FILE``: the command line's own)."""
    engine = bind if isinstance(bind, Engine) else bind.engine
    with _WRITERS_LOCK:
        writer = _WRITERS.get(engine)
    if writer is None:
        from app.settings import Settings

        with _WRITERS_LOCK:
            writer = _WRITERS.setdefault(engine, ChainWriter(AuditSeal.from_settings(Settings())))
    return writer


def _last_entry(session: Session) -> dict[str, Any] | None:
    row = session.execute(select(*_AUDIT.c).order_by(_AUDIT.c.id.desc()).limit(1)).first()
    return None if row is None else dict(row._mapping)


def checkpoint_end(session: Session, writer: ChainWriter) -> Checkpoint | None:
    """Write a checkpoint of the chain's last entry (at shutdown), unless it is the last one this
    process wrote or its hash does not hold (logged: ``qoss audit verify`` says more)."""
    last = _last_entry(session)
    if last is None:
        return None
    key = writer.open(last)
    if last["id"] == writer._marked:
        return None
    if entry_hash(last, key) != last["hash"] and entry_hash(last) != last["hash"]:
        log.error("no audit checkpoint written: the last entry (%d) does not match its hash", last["id"])
        return None
    checkpoint = Checkpoint(int(last["id"]), str(last["hash"]), format_at(utcnow()))
    writer.write(checkpoint)
    return checkpoint


def append(
    cursor: HotCursor, records: Sequence[Mapping[str, Any]], *, writer: ChainWriter,
    due: list[Checkpoint] | None = None,
) -> list[dict[str, Any]]:
    """Append ``records`` to the chain in the cursor's (write) transaction; the entries as written.

    Each record gives every column but ``id``, ``prev_hash`` and ``hash`` (``at`` defaults to
    now; ``token_id``, ``token_name``, ``client_request_id`` to None; ``detail`` to empty).
    A checkpoint due is added to ``due``: the caller writes it (:meth:`ChainWriter.write`)
    after its transaction commits.

    Raises:
        AuditKeyError: see :meth:`ChainWriter.open`.
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
    key = writer.key
    if key is None:  # this process's first append: the key checked against the chain's end, under the lock
        last_row = cursor.first(_LAST_ENTRY, {})
        key = writer.open(None if last_row is None else dict(zip(_AUDIT.c.keys(), last_row, strict=True)))
    if sqlite:  # after the largest id and the head's: never the id of a removed last entry
        base = max(int(found[2] or 0), last_id or 0)
        ids = list(range(base + 1, base + len(rows) + 1))
    else:
        ids = _ids(cursor, len(rows), last_id)
    linked = link(rows, ids=ids, prev_hash=prev_hash, key=key)
    cursor.execute_many(_INSERT, linked)
    cursor.execute_many(INSERT_EVENT, [
        {"at": r["at"], "kind": "audit", "subject": str(r["id"]), "scope": "audit:read",
         "data": {k: r[k] for k in ("id", "action", "object", "outcome", "token_name", "source", "detail")}}
        for r in linked])
    cursor.execute(_SET_HEAD, {"last_id": linked[-1]["id"], "hash": linked[-1]["hash"]})
    checkpoint = writer.due(last_id, linked)
    if checkpoint is not None and due is not None:
        due.append(checkpoint)
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
    writer = writer_of(session.get_bind())
    due: list[Checkpoint] = []
    with session_cursor(session) as cursor:
        linked = append(cursor, records, writer=writer, due=due)
    if due:
        session.info.setdefault(_DUE, []).extend((writer, c) for c in due)
        if not event.contains(session, "after_commit", _write_due):
            event.listen(session, "after_commit", _write_due)
            event.listen(session, "after_rollback", _drop_due)
    return linked


_DUE = "qoss.audit.checkpoints"


def _write_due(session: Session) -> None:
    for writer, checkpoint in session.info.pop(_DUE, ()):
        writer.write(checkpoint)


def _drop_due(session: Session) -> None:
    for writer, _ in session.info.pop(_DUE, ()):  # those entries went with the rollback
        writer.dropped()


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
