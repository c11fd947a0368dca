"""The unit of work on SQLAlchemy: one session, its repositories (``app.domain.ports.UnitOfWork``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Self, TypeVar

from sqlalchemy.orm import Session

from app.adapters.db import audit as audit_records
from app.adapters.db.repositories import (
    AuditRepository,
    EventRepository,
    GatewayRepository,
    IdempotencyRepository,
    PeerRepository,
    PolicyRepository,
    RatingTableRepository,
    ServerKeyRepository,
    SessionRepository,
    ShippedLoadRepository,
    TokenRepository,
    TunnelRepository,
)

if TYPE_CHECKING:
    from app.adapters.db.write_groups import WriteGroups

__all__ = ["SessionTransaction", "SqlUnitOfWork", "sql_units_of_work"]

_T = TypeVar("_T")


class SessionTransaction:
    """One SQLAlchemy session as a unit of work's transaction (its stores are the subclass's).

    Args:
        session: the transaction. A request's session is the request's (its dependency
            commits or rolls back, and closes it); one made by :func:`sql_units_of_work`
            is this unit of work's own and closed by ``with``.
        owned: close the session on leaving ``with``.
        groups: where :meth:`SqlUnitOfWork.commit_with` commits together with other writers (SQLite), or None.
    """

    def __init__(self, session: Session, *, owned: bool = False, groups: WriteGroups | None = None) -> None:
        self.session = session
        self._owned = owned
        self._groups = groups

    def commit(self) -> None:
        self.session.commit()

    def rollback(self) -> None:
        self.session.rollback()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            self.session.close()  # rolls back what was not committed
        elif self.session.in_transaction():
            self.session.rollback()


class SqlUnitOfWork(SessionTransaction):
    """The stores of one SQLAlchemy session."""

    def commit_with(self, work: Callable[[SqlUnitOfWork], _T]) -> _T:
        """``work(unit)`` and its commit: in a group of writers (:mod:`app.adapters.db.write_groups`,
        with this session's audit record) when this unit has groups and holds nothing uncommitted;
        otherwise on this unit, committed with whatever it holds."""
        session = self.session
        if self._groups is None or session.in_transaction() or session.new or session.dirty or session.deleted:
            result = work(self)
            self.commit()
            return result
        return self._groups.run(self, work, audit_records.take(session))

    @cached_property
    def tables(self) -> RatingTableRepository:
        return RatingTableRepository(self.session)

    @cached_property
    def policies(self) -> PolicyRepository:
        return PolicyRepository(self.session)

    @cached_property
    def gateways(self) -> GatewayRepository:
        return GatewayRepository(self.session)

    @cached_property
    def tunnels(self) -> TunnelRepository:
        return TunnelRepository(self.session)

    @cached_property
    def tokens(self) -> TokenRepository:
        return TokenRepository(self.session)

    @cached_property
    def sessions(self) -> SessionRepository:
        return SessionRepository(self.session)

    @cached_property
    def audit(self) -> AuditRepository:
        return AuditRepository(self.session)

    @cached_property
    def events(self) -> EventRepository:
        return EventRepository(self.session)

    @cached_property
    def idempotency(self) -> IdempotencyRepository:
        return IdempotencyRepository(self.session)

    @cached_property
    def server_keys(self) -> ServerKeyRepository:
        return ServerKeyRepository(self.session)

    @cached_property
    def shipped(self) -> ShippedLoadRepository:
        return ShippedLoadRepository(self.session)

    @cached_property
    def peers(self) -> PeerRepository:
        return PeerRepository(self.session)


def sql_units_of_work(session_factory: Callable[[], Session]) -> Callable[[], SqlUnitOfWork]:
    """A factory of units of work, each with a fresh session of ``session_factory``."""
    return lambda: SqlUnitOfWork(session_factory(), owned=True)
