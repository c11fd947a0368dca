"""API tokens: create (the secret is shown once), authenticate, list, revoke; the audit log."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from app.domain.auth import (
    TokenRecord,
    Unauthenticated,
    hash_secret,
    parse_token,
    secret_matches,
    token_lifetime,
    validate_scopes,
    validate_token_name,
)
from app.domain.errors import Conflict
from app.domain.ports import UnitOfWork
from app.domain.ratelimit import FailureLimit

__all__ = ["authenticate", "authenticate_source", "create_first_token", "create_token", "creation_detail", "list_audit",
           "list_tokens", "made_token", "record_audit", "revoke_token"]


def _audit_local(uow: UnitOfWork, *, action: str, token_id: str, outcome: int, by: str, detail: str) -> None:
    """The audit record of a token change made outside the API (``qoss token ...``)."""
    uow.audit.append(
        request_id=f"local-{secrets.token_hex(8)}", token_id=None, token_name=by[:64], scopes=[], source="local",
        action=action, object=f"/v1/tokens/{token_id}", outcome=outcome, detail=detail[:200],
    )


def create_token(
    *, uow: UnitOfWork, name: str, scopes: Iterable[str], expires_in: int | None, created_by: str,
    audit: bool = True,
) -> tuple[str, TokenRecord]:
    """A new token; the plaintext is returned here and nowhere else, ever.

    Args:
        expires_in: seconds until it expires (None: one year).
        audit: append an audit record of the creation (the API passes False: its
            middleware records every request already).
    """
    ttl = token_lifetime(expires_in)
    name = validate_token_name(name)
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    record = TokenRecord(id=token_id, name=name, scopes=validate_scopes(scopes), secret_hash=hash_secret(secret),
                         created_at=now, expires_at=now + ttl, revoked_at=None, created_by=created_by)
    uow.tokens.add(record, created_by=created_by)
    if audit:
        _audit_local(uow, action="POST", token_id=token_id, outcome=201, by=created_by,
                     detail=creation_detail(record))
    return f"qoss_{token_id}_{secret}", record


def creation_detail(record: TokenRecord) -> str:
    """The audit detail of a token's creation, wherever it was made (API, console, command line)."""
    return f"token {record.id} created, scopes {','.join(sorted(record.scopes))}"


def made_token(token: str, record: TokenRecord) -> dict[str, Any]:
    """The answer to a token's creation, the only one that carries its secret (``token``)."""
    return {"id": record.id, "name": record.name, "scopes": sorted(record.scopes), "token": token,
            "expires_at": record.expires_at.isoformat() if record.expires_at else None}


def create_first_token(
    *, uow: UnitOfWork, name: str, scopes: Iterable[str], expires_in: int | None, created_by: str,
) -> tuple[str, TokenRecord]:
    """A token made on the database's own machine (``qoss token create`` with no token chosen),
    audited as ``created_by``: how the first admin token comes to be. Once the database holds a
    usable admin token, tokens are made through the service, by an admin, and this refuses.

    Raises:
        Conflict: the database has a usable admin token already (nothing written).
    """
    now = datetime.now(UTC)
    if any("admin" in t.scopes and t.usable(now) for t in uow.tokens.list()):
        raise Conflict("this database has an admin token already: make tokens through the service "
                       "(QOSS_URL, and QOSS_TOKEN an admin token, or a context: qoss token create then goes "
                       "through it, audited under that token's name)")
    return create_token(uow=uow, name=name, scopes=scopes, expires_in=expires_in, created_by=created_by)


def authenticate(*, uow: UnitOfWork, presented: str | None) -> TokenRecord:
    """The token record behind a presented token.

    Raises:
        Unauthenticated: missing, malformed, unknown, wrong secret, expired or revoked —
            all alike, so a caller learns nothing about which.
    """
    token_id, secret = parse_token(presented)
    record = uow.tokens.find(token_id)
    if record is None:
        secret_matches(secret, "0" * 64)  # same work as a real comparison
        raise Unauthenticated()
    if not secret_matches(secret, record.secret_hash) or not record.usable(datetime.now(UTC)):
        raise Unauthenticated()
    return record


def authenticate_source(*, uow: UnitOfWork, presented: str | None, source: str,
                        failures: FailureLimit | None) -> TokenRecord:
    """:func:`authenticate` a token that ``source`` (a client address) presented, held to
    ``failures``: a source barred for its failures is refused before its token is read, and a
    failure is counted against the source.

    Raises:
        RateLimited: ``source`` failed too often of late (429): its token is not looked up.
        Unauthenticated: as :func:`authenticate`.
    """
    if failures is not None:
        failures.check(source)
    try:
        return authenticate(uow=uow, presented=presented)
    except Unauthenticated:
        if failures is not None:
            failures.failed(source)
        raise


def list_tokens(*, uow: UnitOfWork) -> list[dict[str, Any]]:
    """Tokens without their secrets, each with who made it (``created_by``)."""
    return [
        {"id": t.id, "name": t.name, "scopes": sorted(t.scopes), "created_at": t.created_at.isoformat(),
         "created_by": t.created_by,
         "expires_at": t.expires_at.isoformat() if t.expires_at else None,
         "revoked": t.revoked_at is not None}
        for t in uow.tokens.list()
    ]


def revoke_token(*, uow: UnitOfWork, token_id: str, revoked_by: str = "local", audit: bool = True) -> None:
    """Revoke a token at once.

    Args:
        audit: append an audit record of the revocation (the API passes False).

    Raises:
        NotFound: no such token.
    """
    uow.tokens.revoke(token_id)
    if audit:
        _audit_local(uow, action="DELETE", token_id=token_id, outcome=204, by=revoked_by,
                     detail=f"token {token_id} revoked")


def record_audit(*, uow: UnitOfWork, **fields: Any) -> None:
    """Append one audit record (the caller commits)."""
    uow.audit.append(**fields)


def list_audit(*, uow: UnitOfWork, limit: int, before_id: int | None, after_id: int | None = None,
               outcome: int | None = None, action: str | None = None) -> list[dict[str, Any]]:
    """Audit records, newest first: ``before_id`` and ``after_id`` page, ``outcome`` and ``action`` filter."""
    return uow.audit.list(limit=limit, before_id=before_id, after_id=after_id, outcome=outcome, action=action)
