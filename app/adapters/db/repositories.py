"""Repositories: domain objects in and out of the database. They flush, never commit.

Optimistic concurrency is decided by the database itself: a write moves the current
revision with ``UPDATE ... WHERE current_revision = :expected``; zero rows means someone
else wrote first (StaleRevision). The unique (object, revision) constraint is the backstop.
"""

from __future__ import annotations

import builtins
from typing import Any, cast

from sqlalchemy import CursorResult, Update, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.models import (
    ApiTokenRow,
    AuditRow,
    GatewayRow,
    IdempotencyRow,
    PolicyRevisionRow,
    PolicyRow,
    RatingTableRevisionRow,
    RatingTableRow,
    TunnelRow,
    utcnow,
)
from app.domain.auth import TokenRecord
from app.domain.errors import AlreadyExists, NotFound, StaleRevision
from app.domain.policies import Policy
from app.domain.ratings import LEVEL_DIMENSIONS, RatingTable
from app.domain.tunnels import Gateway, PeerEnd, TunnelRecord, TunnelState

__all__ = [
    "GatewayRepository",
    "PolicyRepository",
    "RatingTableRepository",
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


class RatingTableRepository:
    """Rating tables with full revision history.

    Every revision stores the whole ``RatingTable.as_dict()`` document and its changes
    against the previous revision. The repository flushes and never commits: the caller's
    (request-scoped) session commits or rolls back.
    """

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session``.

        Args:
            session: The unit of work; committed by the caller, never here.
        """
        self.session = session

    def _row(self, name: str) -> RatingTableRow:
        row = self.session.scalar(select(RatingTableRow).where(RatingTableRow.name == name))
        if row is None:
            raise NotFound(f"rating table {name!r} does not exist")
        return row

    def _content(self, table_id: int, revision: int) -> dict[str, Any]:
        content = self.session.scalar(
            select(RatingTableRevisionRow.content).where(
                RatingTableRevisionRow.table_id == table_id, RatingTableRevisionRow.revision == revision
            )
        )
        if content is None:
            raise NotFound(f"revision {revision} does not exist")
        return cast(dict[str, Any], content)

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
        if self.session.scalar(select(RatingTableRow.id).where(RatingTableRow.name == table.name)) is not None:
            raise AlreadyExists(f"rating table {table.name!r} exists already")
        row = RatingTableRow(name=table.name, current_revision=1)
        try:
            with self.session.begin_nested():
                self.session.add(row)
                self.session.flush()
                content = table.as_dict()
                self.session.add(RatingTableRevisionRow(
                    table_id=row.id, revision=1, author=author, message=message, content=content,
                    changes=diff_tables(None, content),
                ))
                self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"rating table {table.name!r} exists already") from exc
        return 1

    def get(self, name: str) -> RatingTable:
        """The current revision of a table.

        Args:
            name: The table's name.

        Returns:
            The table, its ``revision`` set to the current one.

        Raises:
            NotFound: No such table.
        """
        row = self._row(name)
        return RatingTable.from_dict(self._content(row.id, row.current_revision), revision=row.current_revision)

    def get_revision(self, name: str, revision: int) -> RatingTable:
        """A past (or the current) revision of a table.

        Args:
            name: The table's name.
            revision: The revision number, from 1.

        Raises:
            NotFound: No such table, or no such revision of it.
        """
        row = self._row(name)
        try:
            content = self._content(row.id, revision)
        except NotFound as exc:
            raise NotFound(f"rating table {name!r} has no revision {revision}") from exc
        return RatingTable.from_dict(content, revision=revision)

    def current_revision(self, name: str) -> int:
        """The current revision number, in one cheap query (for cache validation).

        Raises:
            NotFound: No such table.
        """
        revision = self.session.scalar(select(RatingTableRow.current_revision).where(RatingTableRow.name == name))
        if revision is None:
            raise NotFound(f"rating table {name!r} does not exist")
        return revision

    def list(self) -> list[dict[str, Any]]:
        """A summary of every table, by name.

        Returns:
            ``{"name", "revision", "description", "ratings" (count), "updated_at" (ISO 8601)}``
            per table.
        """
        rows = self.session.execute(
            select(RatingTableRow, RatingTableRevisionRow.content)
            .join(RatingTableRevisionRow, (RatingTableRevisionRow.table_id == RatingTableRow.id)
                  & (RatingTableRevisionRow.revision == RatingTableRow.current_revision))
            .order_by(RatingTableRow.name)
        ).all()
        return [
            {"name": r.name, "revision": r.current_revision, "description": c.get("description", ""),
             "ratings": len(c.get("ratings", [])), "updated_at": r.updated_at.isoformat()}
            for r, c in rows
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
        row_id = self.session.scalar(select(RatingTableRow.id).where(RatingTableRow.name == table.name))
        if row_id is None:
            raise NotFound(f"rating table {table.name!r} does not exist")
        new = expected_revision + 1
        content = table.as_dict()
        try:
            with self.session.begin_nested():
                moved = _rowcount(self.session, (
                    update(RatingTableRow)
                    .where(RatingTableRow.id == row_id, RatingTableRow.current_revision == expected_revision)
                    .values(current_revision=new, updated_at=utcnow())
                ))
                if moved == 1:
                    old = self._content(row_id, expected_revision)
                    self.session.add(RatingTableRevisionRow(
                        table_id=row_id, revision=new, author=author, message=message, content=content,
                        changes=diff_tables(old, content),
                    ))
                    self.session.flush()
        except IntegrityError as exc:
            raise StaleRevision(table.name, expected_revision, new) from exc
        if moved != 1:
            raise StaleRevision(table.name, expected_revision, self.current_revision(table.name))
        return new

    def revisions(self, name: str) -> builtins.list[dict[str, Any]]:
        """A table's history, oldest first.

        Returns:
            ``{"revision", "author", "created_at" (ISO 8601, UTC), "message", "changes"}``
            per revision, ``changes`` as made by :func:`diff_tables`.

        Raises:
            NotFound: No such table.
        """
        row = self._row(name)
        revs = self.session.scalars(
            select(RatingTableRevisionRow).where(RatingTableRevisionRow.table_id == row.id)
            .order_by(RatingTableRevisionRow.revision)
        ).all()
        return [
            {"revision": r.revision, "author": r.author, "created_at": r.created_at.isoformat(),
             "message": r.message, "changes": r.changes}
            for r in revs
        ]

    def delete(self, name: str) -> None:
        """Delete a table and its whole history.

        Raises:
            NotFound: No such table.
        """
        row = self._row(name)
        self.session.execute(delete(RatingTableRevisionRow).where(RatingTableRevisionRow.table_id == row.id))
        self.session.delete(row)
        self.session.flush()


class PolicyRepository:
    """Policies with full revision history, like :class:`RatingTableRepository`."""

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session``.

        Args:
            session: The unit of work; committed by the caller, never here.
        """
        self.session = session

    def _row(self, name: str) -> PolicyRow:
        row = self.session.scalar(select(PolicyRow).where(PolicyRow.name == name))
        if row is None:
            raise NotFound(f"policy {name!r} does not exist")
        return row

    def create(self, policy: Policy, *, author: str, message: str = "created") -> int:
        """Store a new policy at revision 1.

        Args:
            policy: The policy; ``policy.name`` is its key.
            author: Who made it.
            message: Why, for the history.

        Returns:
            The new revision, 1.

        Raises:
            AlreadyExists: A policy of that name exists (nothing is written).
        """
        if self.session.scalar(select(PolicyRow.id).where(PolicyRow.name == policy.name)) is not None:
            raise AlreadyExists(f"policy {policy.name!r} exists already")
        try:
            with self.session.begin_nested():
                row = PolicyRow(name=policy.name, current_revision=1)
                self.session.add(row)
                self.session.flush()
                self.session.add(PolicyRevisionRow(policy_id=row.id, revision=1, author=author, message=message,
                                                   content=policy.as_dict()))
                self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"policy {policy.name!r} exists already") from exc
        return 1

    def get(self, name: str) -> tuple[Policy, int]:
        """The current revision of a policy.

        Returns:
            The policy and its current revision number.

        Raises:
            NotFound: No such policy.
        """
        row = self._row(name)
        content = self.session.scalar(
            select(PolicyRevisionRow.content).where(PolicyRevisionRow.policy_id == row.id,
                                                    PolicyRevisionRow.revision == row.current_revision)
        )
        if content is None:
            raise NotFound(f"policy {name!r} has no revision {row.current_revision}")
        return Policy.from_dict(content), row.current_revision

    def current_revision(self, name: str) -> int:
        """The current revision number, in one cheap query.

        Raises:
            NotFound: No such policy.
        """
        revision = self.session.scalar(select(PolicyRow.current_revision).where(PolicyRow.name == name))
        if revision is None:
            raise NotFound(f"policy {name!r} does not exist")
        return revision

    def list(self) -> list[dict[str, Any]]:
        """A summary of every policy, by name.

        Returns:
            ``{"name", "revision", "description", "min_levels", "objectives"}`` per policy.
        """
        rows = self.session.execute(
            select(PolicyRow, PolicyRevisionRow.content)
            .join(PolicyRevisionRow, (PolicyRevisionRow.policy_id == PolicyRow.id)
                  & (PolicyRevisionRow.revision == PolicyRow.current_revision))
            .order_by(PolicyRow.name)
        ).all()
        return [{"name": r.name, "revision": r.current_revision, "description": c.get("description", ""),
                 "min_levels": c.get("min_levels"), "objectives": c.get("objectives")} for r, c in rows]

    def update(self, policy: Policy, *, expected_revision: int, author: str, message: str = "replaced") -> int:
        """Store ``policy`` as the next revision if ``expected_revision`` is still current.

        Same atomic compare-and-set as :meth:`RatingTableRepository.update`.

        Args:
            policy: The new content; ``policy.name`` names the policy to update.
            expected_revision: The revision the caller based its edit on (If-Match).
            author: Who made the edit.
            message: Why, for the history.

        Returns:
            The new revision, ``expected_revision + 1``.

        Raises:
            NotFound: No such policy.
            StaleRevision: Another write came first (nothing is written).
        """
        row_id = self.session.scalar(select(PolicyRow.id).where(PolicyRow.name == policy.name))
        if row_id is None:
            raise NotFound(f"policy {policy.name!r} does not exist")
        new = expected_revision + 1
        try:
            with self.session.begin_nested():
                moved = _rowcount(self.session, (
                    update(PolicyRow)
                    .where(PolicyRow.id == row_id, PolicyRow.current_revision == expected_revision)
                    .values(current_revision=new, updated_at=utcnow())
                ))
                if moved == 1:
                    self.session.add(PolicyRevisionRow(policy_id=row_id, revision=new, author=author,
                                                       message=message, content=policy.as_dict()))
                    self.session.flush()
        except IntegrityError as exc:
            raise StaleRevision(policy.name, expected_revision, new) from exc
        if moved != 1:
            raise StaleRevision(policy.name, expected_revision, self.current_revision(policy.name))
        return new

    def revisions(self, name: str) -> builtins.list[dict[str, Any]]:
        """A policy's history, oldest first.

        Returns:
            ``{"revision", "author", "created_at" (ISO 8601, UTC), "message", "changes"}``
            per revision, ``changes`` as made by :func:`diff_policies` against the
            revision before.

        Raises:
            NotFound: No such policy.
        """
        row = self._row(name)
        revs = self.session.scalars(
            select(PolicyRevisionRow).where(PolicyRevisionRow.policy_id == row.id).order_by(PolicyRevisionRow.revision)
        ).all()
        history: builtins.list[dict[str, Any]] = []
        previous: dict[str, Any] | None = None
        for r in revs:
            history.append({"revision": r.revision, "author": r.author, "created_at": r.created_at.isoformat(),
                            "message": r.message, "changes": diff_policies(previous, r.content)})
            previous = r.content
        return history

    def delete(self, name: str) -> None:
        """Delete a policy and its whole history.

        Raises:
            NotFound: No such policy.
        """
        row = self._row(name)
        self.session.execute(delete(PolicyRevisionRow).where(PolicyRevisionRow.policy_id == row.id))
        self.session.delete(row)
        self.session.flush()


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
        self.session.add(AuditRow(**fields))
        self.session.flush()

    def list(self, *, limit: int = 100, before_id: int | None = None) -> list[dict[str, Any]]:
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if before_id is not None:
            query = query.where(AuditRow.id < before_id)
        return [
            {"id": r.id, "at": r.at.isoformat(), "request_id": r.request_id, "token_id": r.token_id,
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
