"""What a database keeps about itself and its callers: idempotency answers, its own random
keys, which shipped documents it was offered. Repositories flush, never commit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.models import IdempotencyRow, ServerKeyRow, ShippedLoadRow, utcnow
from app.domain.ports import StoredAnswer

__all__ = ["IdempotencyRepository", "ServerKeyRepository", "ShippedLoadRepository"]

#: The status of a claimed key whose request has not answered yet.
IN_PROGRESS = 0


class IdempotencyRepository:
    """Answers remembered by (token, Idempotency-Key); the unique pair decides a race."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def _where(self, token_id: str, key: str) -> tuple[Any, Any]:
        return IdempotencyRow.token_id == token_id, IdempotencyRow.key == key

    def find(self, token_id: str, key: str) -> StoredAnswer | None:
        row = self.session.scalar(select(IdempotencyRow).where(*self._where(token_id, key)))
        return (StoredAnswer(row.request_hash, row.status, dict(row.body), row.created_at)
                if row is not None else None)

    def reserve(self, token_id: str, key: str, request_hash: str) -> bool:
        """Claim the key (status 0); False if another request holds it (nothing written)."""
        try:
            with self.session.begin_nested():
                self.session.add(IdempotencyRow(token_id=token_id, key=key, request_hash=request_hash,
                                                status=IN_PROGRESS, body={}))
                self.session.flush()
        except IntegrityError:
            return False
        return True

    def complete(self, token_id: str, key: str, *, status: int, body: dict[str, Any]) -> None:
        self.session.execute(update(IdempotencyRow).where(*self._where(token_id, key)).values(status=status, body=body))

    def release(self, token_id: str, key: str) -> None:
        self.session.execute(delete(IdempotencyRow).where(*self._where(token_id, key),
                                                          IdempotencyRow.status == IN_PROGRESS))

    def take_over(self, token_id: str, key: str, *, claimed_before: datetime) -> bool:
        done = self.session.execute(update(IdempotencyRow).where(
            *self._where(token_id, key), IdempotencyRow.status == IN_PROGRESS,
            IdempotencyRow.created_at < claimed_before).values(created_at=utcnow()))
        return int(getattr(done, "rowcount", 0) or 0) == 1


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
