"""Console sessions: sign in with an API token, find the signed-in token (or the identity
provider's user: :mod:`app.services.console_oidc`), sign out.

A session never outlives its token: every request checks the token again, so a revoked or
expired token ends its sessions at once (see :mod:`app.domain.sessions` for what is stored).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.domain.auth import TokenRecord, Unauthenticated
from app.domain.ports import UnitOfWork
from app.domain.ratelimit import FailureLimit
from app.domain.sessions import SessionRecord, hash_session_id, new_session_id, session_expiry
from app.services.auth import authenticate_source

__all__ = ["resolve", "sign_in", "sign_out"]


def sign_in(*, uow: UnitOfWork, presented: str | None, ttl: timedelta, now: datetime | None = None,
            source: str = "", failures: FailureLimit | None = None) -> tuple[str, SessionRecord, TokenRecord]:
    """A new session for a valid token; also forgets every session that has ended. The token is
    checked as the API checks one, held to ``source``'s limit of failed checks (``failures``).

    Returns:
        The session id (for the cookie: it is not stored), its record and the token's.

    Raises:
        Unauthenticated: the token is missing, malformed, unknown, expired or revoked.
        RateLimited: ``source`` failed too often of late: its token is not looked up (429).
    """
    token = authenticate_source(uow=uow, presented=presented, source=source, failures=failures)
    at = now or datetime.now(UTC)
    session_id = new_session_id()
    record = SessionRecord(id_hash=hash_session_id(session_id), token_id=token.id, created_at=at,
                           expires_at=session_expiry(at, ttl, token.expires_at))
    uow.sessions.delete_ended(at)
    uow.sessions.add(record)
    return session_id, record, token


def resolve(*, uow: UnitOfWork, session_id: str | None, now: datetime | None = None,
            mapping_hash: str | None = None) -> tuple[SessionRecord, TokenRecord | None]:
    """The live session behind a session id and its token, checked now. A session of the identity
    provider's user has no token (None): it holds only while it was granted under
    ``mapping_hash``, the fingerprint of the provider's mapping now (None: no such sign-in now).

    Raises:
        Unauthenticated: no such session, it has expired, its token is revoked or expired, or the
            mapping it was granted under is not the one now.
    """
    if not session_id or len(session_id) > 128:
        raise Unauthenticated()
    at = now or datetime.now(UTC)
    record = uow.sessions.find(hash_session_id(session_id))
    if record is None or not record.live(at):
        raise Unauthenticated()
    if record.token_id is None:
        if mapping_hash is None or record.mapping_hash != mapping_hash:
            raise Unauthenticated()
        return record, None
    token = uow.tokens.find(record.token_id)
    if token is None or not token.usable(at):
        raise Unauthenticated()
    return record, token


def sign_out(*, uow: UnitOfWork, session_id: str | None) -> None:
    """End a session (an unknown or ended one is no error)."""
    if session_id and len(session_id) <= 128:
        uow.sessions.delete(hash_session_id(session_id))
