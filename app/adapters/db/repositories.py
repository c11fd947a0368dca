"""Repositories: domain objects in and out of the database. They flush, never commit.

Optimistic concurrency is decided by the database itself: a write moves the current
revision with ``UPDATE ... WHERE current_revision = :expected``; zero rows means someone
else wrote first (StaleRevision). The unique (object, revision) constraint is the backstop.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, Update, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db import audit_chain
from app.adapters.db.models import (
    ApiTokenRow,
    AuditRow,
    GatewayRow,
    IdempotencyRow,
    PolicyRevisionRow,
    PolicyRow,
    RatingTableRevisionRow,
    RatingTableRow,
    ServerKeyRow,
    ShippedLoadRow,
    TunnelRow,
    utcnow,
)
from app.domain.auth import TokenRecord
from app.domain.errors import AlreadyExists, NotFound, StaleRevision
from app.domain.policies import Policy
from app.domain.ratings import LEVEL_DIMENSIONS, RatingTable
from app.domain.tunnels import Gateway, PeerEnd, TunnelRecord, TunnelState

__all__ = [
    "AuditRepository",
    "GatewayRepository",
    "IdempotencyRepository",
    "PolicyRepository",
    "RatingTableRepository",
    "ServerKeyRepository",
    "ShippedLoadRepository",
    "TunnelRepository",
    "diff_policies",
    "diff_tables",
]

_ROW_FIELDS = (*LEVEL_DIMENSIONS, "performance", "source", "reason", "requirement", "measurement")


def diff_tables(old: dict[str, Any] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-algorithm, per-field changes between two table documents.

    Args:
        old: The previous revision's ``RatingTable.as_dict()``, None for a new table.
        new: The new revision's ``RatingTable.as_dict()``.

    Returns:
        ``{"algorithm", "field", "old", "new"}`` entries: a whole row added or removed is
        field ``"*"``; a table-level field (description, source) has algorithm None.
    """
    before = {r["algorithm"]: r for r in (old or {}).get("ratings", [])}
    after = {r["algorithm"]: r for r in new.get("ratings", [])}
    changes: list[dict[str, Any]] = []
    for alg in [*after, *[a for a in before if a not in after]]:
        b, a = before.get(alg, {}), after.get(alg, {})
        if not b:
            changes.append({"algorithm": alg, "field": "*", "old": None, "new": "added"})
            continue
        if not a:
            changes.append({"algorithm": alg, "field": "*", "old": "present", "new": "removed"})
            continue
        for field in _ROW_FIELDS:
            if b.get(field) != a.get(field):
                changes.append({"algorithm": alg, "field": field, "old": b.get(field), "new": a.get(field)})
    for field in ("description", "source"):
        if old is not None and old.get(field) != new.get(field):
            changes.append({"algorithm": None, "field": field, "old": old.get(field), "new": new.get(field)})
    return changes


def diff_policies(old: dict[str, Any] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-field changes between two policy documents (``Policy.as_dict()``).

    Args:
        old: The previous revision's document, None for the first revision.
        new: This revision's document.

    Returns:
        ``{"field", "old", "new"}`` entries sorted by field (PostgreSQL's JSONB keeps no key
        order); empty for the first revision.
    """
    if old is None:
        return []
    return [
        {"field": key, "old": old.get(key), "new": new.get(key)}
        for key in sorted({*old, *new})
        if old.get(key) != new.get(key)
    ]


def _rowcount(session: Session, statement: Update) -> int:
    """Execute a bulk UPDATE and return how many rows it matched."""
    result = cast(CursorResult[Any], session.execute(statement.execution_options(synchronize_session=False)))
    return result.rowcount


class _Revisioned:
    """Named documents with full revision history (rating tables, policies).

    Each object is a row (name, current revision) and one revision row per revision with
    the whole document. Subclasses name their two models, the revision row's key column and
    the noun used in messages.
    """

    _row_model: Any
    _rev_model: Any
    _owner: str
    _noun: str

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session``.

        Args:
            session: The unit of work; committed by the caller, never here.
        """
        self.session = session

    def _row(self, name: str) -> Any:
        row = self.session.scalar(select(self._row_model).where(self._row_model.name == name))
        if row is None:
            raise NotFound(f"{self._noun} {name!r} does not exist")
        return row

    def _owner_of(self) -> Any:
        return getattr(self._rev_model, self._owner)

    def _content(self, owner_id: int, revision: int) -> dict[str, Any] | None:
        content = self.session.scalar(
            select(self._rev_model.content).where(self._owner_of() == owner_id, self._rev_model.revision == revision))
        return cast(dict[str, Any] | None, content)

    def _revision_content(self, name: str, revision: int | None = None) -> tuple[dict[str, Any], int]:
        """A revision's document (the current one by default) and its number."""
        row = self._row(name)
        wanted = row.current_revision if revision is None else revision
        content = self._content(row.id, wanted)
        if content is None:
            raise NotFound(f"{self._noun} {name!r} has no revision {wanted}")
        return content, wanted

    def _create(self, name: str, content: dict[str, Any], *, author: str, message: str,
                **extra: Any) -> int:
        """Store a new object at revision 1 (nothing is written if the name is taken)."""
        if self.session.scalar(select(self._row_model.id).where(self._row_model.name == name)) is not None:
            raise AlreadyExists(f"{self._noun} {name!r} exists already")
        try:
            with self.session.begin_nested():
                row = self._row_model(name=name, current_revision=1)
                self.session.add(row)
                self.session.flush()
                self.session.add(self._rev_model(**{self._owner: row.id}, revision=1, author=author,
                                                 message=message, content=content, **extra))
                self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"{self._noun} {name!r} exists already") from exc
        return 1

    def _update(self, name: str, content: dict[str, Any], *, expected_revision: int, author: str, message: str,
                extra: Callable[[dict[str, Any] | None], dict[str, Any]] = lambda _old: {}) -> int:
        """Store ``content`` as the next revision if ``expected_revision`` is still current.

        ``extra`` makes further revision-row fields from the previous revision's document.
        """
        row_id = self.session.scalar(select(self._row_model.id).where(self._row_model.name == name))
        if row_id is None:
            raise NotFound(f"{self._noun} {name!r} does not exist")
        new = expected_revision + 1
        try:
            with self.session.begin_nested():
                moved = _rowcount(self.session, (
                    update(self._row_model)
                    .where(self._row_model.id == row_id, self._row_model.current_revision == expected_revision)
                    .values(current_revision=new, updated_at=utcnow())
                ))
                if moved == 1:
                    fields = extra(self._content(row_id, expected_revision))
                    self.session.add(self._rev_model(**{self._owner: row_id}, revision=new, author=author,
                                                     message=message, content=content, **fields))
                    self.session.flush()
        except IntegrityError as exc:
            raise StaleRevision(name, expected_revision, new) from exc
        if moved != 1:
            raise StaleRevision(name, expected_revision, self.current_revision(name))
        return new

    def current_revision(self, name: str) -> int:
        """The current revision number, in one cheap query (for cache validation).

        Raises:
            NotFound: No such object.
        """
        revision = self.session.scalar(select(self._row_model.current_revision).where(self._row_model.name == name))
        if revision is None:
            raise NotFound(f"{self._noun} {name!r} does not exist")
        return cast(int, revision)

    def _current(self) -> builtins.list[tuple[Any, dict[str, Any]]]:
        """Every object with its current document, by name."""
        rows = self.session.execute(
            select(self._row_model, self._rev_model.content)
            .join(self._rev_model, (self._owner_of() == self._row_model.id)
                  & (self._rev_model.revision == self._row_model.current_revision))
            .order_by(self._row_model.name)
        ).all()
        return [(r, c) for r, c in rows]

    def _revision_rows(self, name: str) -> builtins.list[Any]:
        row = self._row(name)
        return list(self.session.scalars(
            select(self._rev_model).where(self._owner_of() == row.id).order_by(self._rev_model.revision)).all())

    def delete(self, name: str) -> None:
        """Delete an object and its whole history.

        Raises:
            NotFound: No such object.
        """
        row = self._row(name)
        self.session.execute(delete(self._rev_model).where(self._owner_of() == row.id))
        self.session.delete(row)
        self.session.flush()


class RatingTableRepository(_Revisioned):
    """Rating tables with full revision history.

    Every revision stores the whole ``RatingTable.as_dict()`` document and its changes
    against the previous revision. The repository flushes and never commits: the caller's
    (request-scoped) session commits or rolls back.
    """

    _row_model = RatingTableRow
    _rev_model = RatingTableRevisionRow
    _owner = "table_id"
    _noun = "rating table"

    def create(self, table: RatingTable, *, author: str, message: str = "") -> int:
        """Store a new table at revision 1.

        Args:
            table: The table; its ``revision`` is ignored.
            author: Who made it.
            message: Why, for the history.

        Returns:
            The new revision, 1.

        Raises:
            AlreadyExists: A table of that name exists (nothing is written: the rows go in
                under a savepoint that is rolled back on the unique-name violation).
        """
        content = table.as_dict()
        return self._create(table.name, content, author=author, message=message, changes=diff_tables(None, content))

    def get(self, name: str) -> RatingTable:
        """The current revision of a table, its ``revision`` set.

        Raises:
            NotFound: No such table.
        """
        content, revision = self._revision_content(name)
        return RatingTable.from_dict(content, revision=revision)

    def get_revision(self, name: str, revision: int) -> RatingTable:
        """A past (or the current) revision of a table.

        Raises:
            NotFound: No such table, or no such revision of it.
        """
        content, _ = self._revision_content(name, revision)
        return RatingTable.from_dict(content, revision=revision)

    def list(self) -> builtins.list[dict[str, Any]]:
        """A summary of every table, by name.

        Returns:
            ``{"name", "revision", "description", "ratings" (count), "updated_at" (ISO 8601)}``
            per table.
        """
        return [
            {"name": r.name, "revision": r.current_revision, "description": c.get("description", ""),
             "ratings": len(c.get("ratings", [])), "updated_at": r.updated_at.isoformat()}
            for r, c in self._current()
        ]

    def update(self, table: RatingTable, *, expected_revision: int, author: str, message: str = "") -> int:
        """Store ``table`` as the next revision if ``expected_revision`` is still current.

        The check is one atomic ``UPDATE ... WHERE current_revision = :expected`` in the
        database, so of concurrent writers based on the same revision exactly one wins.
        The unique (table, revision) constraint is the backstop.

        Args:
            table: The new content; ``table.name`` names the table to update.
            expected_revision: The revision the caller based its edit on (If-Match).
            author: Who made the edit.
            message: Why, for the history.

        Returns:
            The new revision, ``expected_revision + 1``.

        Raises:
            NotFound: No such table.
            StaleRevision: Another write came first (nothing is written).
        """
        content = table.as_dict()
        return self._update(table.name, content, expected_revision=expected_revision, author=author,
                            message=message, extra=lambda old: {"changes": diff_tables(old, content)})

    def revisions(self, name: str) -> builtins.list[dict[str, Any]]:
        """A table's history, oldest first.

        Returns:
            ``{"revision", "author", "created_at" (ISO 8601, UTC), "message", "changes"}``
            per revision, ``changes`` as made by :func:`diff_tables`.

        Raises:
            NotFound: No such table.
        """
        return [
            {"revision": r.revision, "author": r.author, "created_at": r.created_at.isoformat(),
             "message": r.message, "changes": r.changes}
            for r in self._revision_rows(name)
        ]


class PolicyRepository(_Revisioned):
    """Policies with full revision history, like :class:`RatingTableRepository`."""

    _row_model = PolicyRow
    _rev_model = PolicyRevisionRow
    _owner = "policy_id"
    _noun = "policy"

    def create(self, policy: Policy, *, author: str, message: str = "created") -> int:
        """Store a new policy at revision 1.

        Raises:
            AlreadyExists: A policy of that name exists (nothing is written).
        """
        return self._create(policy.name, policy.as_dict(), author=author, message=message)

    def get(self, name: str) -> tuple[Policy, int]:
        """The current revision of a policy and its number.

        Raises:
            NotFound: No such policy.
        """
        content, revision = self._revision_content(name)
        return Policy.from_dict(content), revision

    def get_revision(self, name: str, revision: int) -> Policy:
        """A past (or the current) revision of a policy.

        Raises:
            NotFound: No such policy, or no such revision of it.
        """
        content, _ = self._revision_content(name, revision)
        return Policy.from_dict(content)

    def list(self) -> builtins.list[dict[str, Any]]:
        """A summary of every policy, by name.

        Returns:
            ``{"name", "revision", "description", "min_levels", "objectives"}`` per policy.
        """
        return [{"name": r.name, "revision": r.current_revision, "description": c.get("description", ""),
                 "min_levels": c.get("min_levels"), "objectives": c.get("objectives")} for r, c in self._current()]

    def update(self, policy: Policy, *, expected_revision: int, author: str, message: str = "replaced") -> int:
        """Store ``policy`` as the next revision if ``expected_revision`` is still current
        (the same atomic compare-and-set as :meth:`RatingTableRepository.update`).

        Raises:
            NotFound: No such policy.
            StaleRevision: Another write came first (nothing is written).
        """
        return self._update(policy.name, policy.as_dict(), expected_revision=expected_revision, author=author,
                            message=message)

    def revisions(self, name: str) -> builtins.list[dict[str, Any]]:
        """A policy's history, oldest first.

        Returns:
            ``{"revision", "author", "created_at" (ISO 8601, UTC), "message", "changes"}``
            per revision, ``changes`` as made by :func:`diff_policies` against the
            revision before.

        Raises:
            NotFound: No such policy.
        """
        history: builtins.list[dict[str, Any]] = []
        previous: dict[str, Any] | None = None
        for r in self._revision_rows(name):
            history.append({"revision": r.revision, "author": r.author, "created_at": r.created_at.isoformat(),
                            "message": r.message, "changes": diff_policies(previous, r.content)})
            previous = r.content
        return history


def _gateway(row: GatewayRow) -> Gateway:
    return Gateway(
        name=row.name, vici_socket=row.vici_socket, ike_address=row.ike_address, identity=row.identity,
        inside_networks=tuple(row.inside_networks), backend=row.backend, version=row.version,
        algorithms=frozenset(row.algorithms),
    )


class GatewayRepository:
    """Registered strongSwan gateways."""

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session`` (committed by the caller, never here)."""
        self.session = session

    def _row(self, name: str) -> GatewayRow:
        row = self.session.scalar(select(GatewayRow).where(GatewayRow.name == name))
        if row is None:
            raise NotFound(f"gateway {name!r} does not exist")
        return row

    def create(self, gateway: Gateway) -> None:
        """Register a gateway.

        Raises:
            AlreadyExists: A gateway of that name exists (nothing is written).
        """
        if self.session.scalar(select(GatewayRow.id).where(GatewayRow.name == gateway.name)) is not None:
            raise AlreadyExists(f"gateway {gateway.name!r} exists already")
        try:
            with self.session.begin_nested():
                self.session.add(GatewayRow(
                    name=gateway.name, vici_socket=gateway.vici_socket, ike_address=gateway.ike_address,
                    identity=gateway.identity, inside_networks=list(gateway.inside_networks),
                    backend=gateway.backend, version=gateway.version, algorithms=sorted(gateway.algorithms),
                ))
                self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"gateway {gateway.name!r} exists already") from exc

    def get(self, name: str) -> Gateway:
        """One gateway.

        Raises:
            NotFound: No such gateway.
        """
        return _gateway(self._row(name))

    def list(self) -> list[Gateway]:
        """Every gateway, by name."""
        return [_gateway(r) for r in self.session.scalars(select(GatewayRow).order_by(GatewayRow.name))]

    def update(self, gateway: Gateway) -> None:
        """Store what was read from a gateway: back end, version, algorithms.

        Raises:
            NotFound: No such gateway.
        """
        row = self._row(gateway.name)
        row.backend, row.version = gateway.backend, gateway.version
        row.algorithms = sorted(gateway.algorithms)
        row.updated_at = utcnow()
        self.session.flush()

    def delete(self, name: str) -> None:
        """Forget a gateway.

        Raises:
            NotFound: No such gateway.
        """
        self.session.delete(self._row(name))
        self.session.flush()


def _tunnel(row: TunnelRow) -> TunnelRecord:
    return TunnelRecord(
        id=row.id, initiator=row.initiator, responder=row.responder, local_ts=tuple(row.local_ts),
        remote_ts=tuple(row.remote_ts), state=TunnelState(row.state), negotiation=row.negotiation,
        detail=row.detail, created_at=row.created_at.isoformat(), updated_at=row.updated_at.isoformat(),
        peer=PeerEnd(**row.peer) if row.peer else None,
    )


class TunnelRepository:
    """Tunnel records (never the PSK)."""

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session`` (committed by the caller, never here)."""
        self.session = session

    def _row(self, tunnel_id: str) -> TunnelRow:
        row = self.session.get(TunnelRow, tunnel_id)
        if row is None:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        return row

    def add(self, record: TunnelRecord) -> TunnelRecord:
        """Store a new tunnel record and return it with its timestamps."""
        row = TunnelRow(
            id=record.id, initiator=record.initiator, responder=record.responder, local_ts=list(record.local_ts),
            remote_ts=list(record.remote_ts), state=record.state.value, detail=record.detail,
            negotiation=dict(record.negotiation), peer=record.peer.as_dict() if record.peer is not None else None,
        )
        self.session.add(row)
        self.session.flush()
        return _tunnel(row)

    def get(self, tunnel_id: str) -> TunnelRecord:
        """One tunnel.

        Raises:
            NotFound: No such tunnel.
        """
        return _tunnel(self._row(tunnel_id))

    def list(self) -> list[TunnelRecord]:
        """Every tunnel, oldest first."""
        return [_tunnel(r) for r in self.session.scalars(select(TunnelRow).order_by(TunnelRow.created_at,
                                                                                    TunnelRow.id))]

    def set_state(self, tunnel_id: str, state: TunnelState, detail: str) -> None:
        """Move a tunnel to ``state`` with a human-readable ``detail``.

        Raises:
            NotFound: No such tunnel.
        """
        row = self._row(tunnel_id)
        row.state, row.detail, row.updated_at = state.value, detail, utcnow()
        self.session.flush()

    def delete(self, tunnel_id: str) -> None:
        """Forget a tunnel.

        Raises:
            NotFound: No such tunnel.
        """
        self.session.delete(self._row(tunnel_id))
        self.session.flush()


class TokenRepository:
    """API tokens (hash only)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @staticmethod
    def _record(row: ApiTokenRow) -> TokenRecord:
        return TokenRecord(id=row.id, name=row.name, scopes=frozenset(row.scopes), secret_hash=row.secret_hash,
                           created_at=row.created_at, expires_at=row.expires_at, revoked_at=row.revoked_at)

    def add(self, record: TokenRecord, *, created_by: str) -> None:
        self.session.add(ApiTokenRow(
            id=record.id, name=record.name, scopes=sorted(record.scopes), secret_hash=record.secret_hash,
            created_by=created_by, created_at=record.created_at, expires_at=record.expires_at,
        ))
        self.session.flush()

    def find(self, token_id: str) -> TokenRecord | None:
        row = self.session.get(ApiTokenRow, token_id)
        return self._record(row) if row is not None else None

    def list(self) -> list[TokenRecord]:
        return [self._record(r) for r in self.session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at))]

    def revoke(self, token_id: str) -> None:
        row = self.session.get(ApiTokenRow, token_id)
        if row is None:
            raise NotFound(f"token {token_id!r} does not exist")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
        self.session.flush()


class AuditRepository:
    """The append-only audit log."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def append(self, **fields: Any) -> None:
        self.append_many([fields])

    def append_many(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append records to the hash chain (``at`` defaults to now, ``detail`` to empty;
        see :mod:`app.adapters.db.audit_chain`)."""
        audit_chain.append_in(self.session, records)

    def list(self, *, limit: int = 100, before_id: int | None = None,
             after_id: int | None = None) -> list[dict[str, Any]]:
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if before_id is not None:
            query = query.where(AuditRow.id < before_id)
        if after_id is not None:
            query = query.where(AuditRow.id > after_id)
        return [
            {"id": r.id, "at": r.at.isoformat(), "request_id": r.request_id,
             "client_request_id": r.client_request_id, "token_id": r.token_id,
             "token_name": r.token_name, "scopes": r.scopes, "source": r.source, "action": r.action,
             "object": r.object, "outcome": r.outcome, "detail": r.detail}
            for r in self.session.scalars(query)
        ]


class IdempotencyRepository:
    """Answers remembered by (token, Idempotency-Key)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def find(self, token_id: str, key: str) -> IdempotencyRow | None:
        return self.session.scalar(
            select(IdempotencyRow).where(IdempotencyRow.token_id == token_id, IdempotencyRow.key == key)
        )

    def remember(self, *, token_id: str, key: str, request_hash: str, status: int, body: dict[str, Any]) -> bool:
        """Store the answer; False if another request with the same key won the race."""
        try:
            with self.session.begin_nested():
                self.session.add(IdempotencyRow(token_id=token_id, key=key, request_hash=request_hash,
                                                status=status, body=body))
                self.session.flush()
        except IntegrityError:
            return False
        return True


class ServerKeyRepository:
    """Random keys of this database, each made once (the first caller's wins a race)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def get_or_create(self, name: str, make: Callable[[], str]) -> str:
        """The key called ``name``; made with ``make()`` and stored if there is none yet."""
        value = self.session.scalar(select(ServerKeyRow.value).where(ServerKeyRow.name == name))
        if value is not None:
            return value
        try:
            with self.session.begin_nested():
                self.session.add(ServerKeyRow(name=name, value=make()))
                self.session.flush()
        except IntegrityError:
            pass  # another process made it first: theirs is the key
        stored: str = self.session.scalars(select(ServerKeyRow.value).where(ServerKeyRow.name == name)).one()
        return stored


class ShippedLoadRepository:
    """Which shipped rating tables and policies were offered to this database (each once)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def loaded(self, kind: str) -> set[str]:
        """The names of ``kind`` (``rating_table`` or ``policy``) offered already."""
        return set(self.session.scalars(select(ShippedLoadRow.name).where(ShippedLoadRow.kind == kind)))

    def record(self, kind: str, name: str) -> None:
        """Note that the shipped ``name`` was offered (nothing if it was already)."""
        exists = self.session.scalar(select(ShippedLoadRow.id).where(ShippedLoadRow.kind == kind,
                                                                     ShippedLoadRow.name == name))
        if exists is None:
            self.session.add(ShippedLoadRow(kind=kind, name=name))
            self.session.flush()
