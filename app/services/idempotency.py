"""Idempotency keys: a retried POST returns the first answer instead of acting twice.

The key is reserved (status 0, committed at once, unique per token) *before* any
side effect, so a concurrent duplicate is refused with 409 instead of creating a
second tunnel; the answer is stored when the work succeeds; a failure releases the key
so the client can retry. Keys are per token: one client cannot read another's answers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.models import IdempotencyRow
from app.domain.errors import Conflict, InvalidInput

__all__ = ["IdempotencyInProgress", "Stored", "abandon", "begin", "complete", "request_hash"]

_IN_PROGRESS = 0


class IdempotencyInProgress(Conflict):
    """A request with this key is still being processed."""


@dataclass(frozen=True)
class Stored:
    status: int
    body: dict[str, Any]


def request_hash(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def begin(factory: Callable[[], Session], *, token_id: str, key: str, digest: str) -> Stored | None:
    """Reserve ``key`` for this token, or return the answer already stored for it.

    Raises:
        InvalidInput: the key was used with a different request body (422).
        IdempotencyInProgress: the first request with this key is still running (409).
    """
    with factory() as session, session.begin():
        row = session.scalar(select(IdempotencyRow).where(IdempotencyRow.token_id == token_id,
                                                          IdempotencyRow.key == key))
        if row is None:
            try:
                with session.begin_nested():
                    session.add(IdempotencyRow(token_id=token_id, key=key, request_hash=digest,
                                               status=_IN_PROGRESS, body={}))
                    session.flush()
                return None
            except IntegrityError:
                row = session.scalar(select(IdempotencyRow).where(IdempotencyRow.token_id == token_id,
                                                                  IdempotencyRow.key == key))
                if row is None:  # released meanwhile
                    raise IdempotencyInProgress("a request with this Idempotency-Key is in progress") from None
        if row.request_hash != digest:
            raise InvalidInput("this Idempotency-Key was used with a different request")
        if row.status == _IN_PROGRESS:
            raise IdempotencyInProgress("a request with this Idempotency-Key is in progress")
        return Stored(row.status, dict(row.body))


def complete(factory: Callable[[], Session], *, token_id: str, key: str, status: int, body: dict[str, Any]) -> None:
    """Store the answer for later retries."""
    with factory() as session, session.begin():
        session.execute(update(IdempotencyRow)
                        .where(IdempotencyRow.token_id == token_id, IdempotencyRow.key == key)
                        .values(status=status, body=body))


def abandon(factory: Callable[[], Session], *, token_id: str, key: str) -> None:
    """Release a reservation after a failure, so a retry can run."""
    with factory() as session, session.begin():
        session.execute(delete(IdempotencyRow).where(IdempotencyRow.token_id == token_id, IdempotencyRow.key == key,
                                                     IdempotencyRow.status == _IN_PROGRESS))
