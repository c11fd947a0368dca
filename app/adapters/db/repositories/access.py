"""API tokens, console sessions and the audit log. Repositories flush, never commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, null, select
from sqlalchemy.orm import Session

from app.adapters.db import audit_chain
from app.adapters.db.models import ApiTokenRow, AuditRow, UiSessionRow, utcnow
from app.adapters.db.notices import publish
from app.adapters.db.read_cache import ReadCache
from app.domain.auth import TokenRecord
from app.domain.errors import NotFound
from app.domain.sessions import SessionRecord

__all__ = ["TOKEN_CACHE", "AuditRepository", "SessionRepository", "TokenCache", "TokenRepository"]

#: Where a session factory's ``info`` holds the process's :class:`TokenCache`.
TOKEN_CACHE = "qoss.token_cache"  # noqa: S105 (a key of session.info, not a secret)


class TokenCache(ReadCache[str, TokenRecord]):
    """API tokens by id (hash of the secret, scopes, expiry, revocation): a request normally
    reads none. This process's revocations are seen at once, another replica's within ``ttl``;
    expiry is checked on every use."""


class TokenRepository:
    """API tokens (hash only)."""

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session``; its factory's :class:`TokenCache`, if it has one,
        spares reads."""
        self.session = session
        self._cache: TokenCache | None = session.info.get(TOKEN_CACHE)

    @staticmethod
    def _record(row: ApiTokenRow) -> TokenRecord:
        return TokenRecord(id=row.id, name=row.name, scopes=frozenset(row.scopes), secret_hash=row.secret_hash,
                           created_at=row.created_at, expires_at=row.expires_at, revoked_at=row.revoked_at,
                           created_by=row.created_by)

    def add(self, record: TokenRecord, *, created_by: str) -> None:
        self.session.add(ApiTokenRow(
            id=record.id, name=record.name, scopes=sorted(record.scopes), secret_hash=record.secret_hash,
            created_by=created_by, created_at=record.created_at, expires_at=record.expires_at,
        ))
        self.session.flush()

    def find(self, token_id: str) -> TokenRecord | None:
        cached = self._cache.fresh(token_id) if self._cache is not None else None
        if cached is not None:
            return cached
        row = self.session.get(ApiTokenRow, token_id)
        if row is None:
            return None
        record = self._record(row)
        if self._cache is not None:
            self._cache.keep(token_id, record)
        return record

    def list(self) -> list[TokenRecord]:
        return [self._record(r) for r in self.session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at))]

    def revoke(self, token_id: str) -> None:
        row = self.session.get(ApiTokenRow, token_id)
        if row is None:
            raise NotFound(f"token {token_id!r} does not exist")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
        self.session.flush()
        publish(self.session, "token", token_id)
        if self._cache is not None:
            self._cache.forget(token_id)


class SessionRepository:
    """Console sessions (the hash of the id only)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, record: SessionRecord) -> None:
        self.session.add(UiSessionRow(
            id_hash=record.id_hash, token_id=record.token_id, created_at=record.created_at,
            expires_at=record.expires_at, subject=record.subject, user_name=record.user_name,
            scopes=sorted(record.scopes) if record.scopes is not None else null(), mapping_hash=record.mapping_hash))
        self.session.flush()

    def find(self, id_hash: str) -> SessionRecord | None:
        row = self.session.get(UiSessionRow, id_hash)
        if row is None:
            return None
        return SessionRecord(id_hash=row.id_hash, token_id=row.token_id, created_at=row.created_at,
                             expires_at=row.expires_at, subject=row.subject, user_name=row.user_name,
                             scopes=frozenset(row.scopes) if row.scopes is not None else None,
                             mapping_hash=row.mapping_hash)

    def delete(self, id_hash: str) -> None:
        self.session.execute(delete(UiSessionRow).where(UiSessionRow.id_hash == id_hash))
        self.session.flush()

    def delete_ended(self, now: datetime) -> int:
        result = self.session.execute(delete(UiSessionRow).where(UiSessionRow.expires_at <= now))
        self.session.flush()
        return int(getattr(result, "rowcount", 0) or 0)


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

    def list(self, *, limit: int = 100, before_id: int | None = None, after_id: int | None = None,
             outcome: int | None = None, action: str | None = None) -> list[dict[str, Any]]:
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if before_id is not None:
            query = query.where(AuditRow.id < before_id)
        if after_id is not None:
            query = query.where(AuditRow.id > after_id)
        if outcome is not None:
            query = query.where(AuditRow.outcome == outcome)
        if action is not None:
            query = query.where(AuditRow.action == action)
        return [
            {"id": r.id, "at": r.at.isoformat(), "request_id": r.request_id,
             "client_request_id": r.client_request_id, "token_id": r.token_id,
             "token_name": r.token_name, "scopes": r.scopes, "source": r.source, "action": r.action,
             "object": r.object, "outcome": r.outcome, "detail": r.detail}
            for r in self.session.scalars(query)
        ]
