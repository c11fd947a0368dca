"""API tokens and scopes (pure): what a token may do, and how a presented token is checked.

A token is ``qoss_<id>_<secret>``: ``id`` (12 hex) finds the record, ``secret`` (43
url-safe base64 chars, 256 bits) is never stored — only its SHA-256, compared in
constant time. High-entropy secrets need no slow hash.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.domain.errors import InvalidInput, QossError

__all__ = [
    "SCOPES",
    "TOKEN_MAX_LIFETIME",
    "TOKEN_NAME_MAX_LENGTH",
    "TOKEN_NAME_PATTERN",
    "Forbidden",
    "TokenRecord",
    "Unauthenticated",
    "check_scopes",
    "hash_secret",
    "parse_token",
    "secret_matches",
    "token_lifetime",
    "validate_scopes",
    "validate_token_name",
]

#: Every scope; ``admin`` implies all others.
SCOPES: frozenset[str] = frozenset({
    "ratings:write", "policies:write", "tunnels:write", "tunnels:read", "gateways:write", "agent:enroll",
    "audit:read", "metrics:read", "peers:write", "agent:enroll-device", "admin",
})

#: A token's name (who or what it is for, shown in token lists, the audit log and the console):
#: a letter or digit, then letters, digits, ``.``, ``_``, ``@`` and ``-``; no spaces, no markup.
TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"  # noqa: S105 - a pattern of names, not a secret
TOKEN_NAME_MAX_LENGTH = 64
#: The longest a token lives, and how long one lives when no lifetime is given.
TOKEN_MAX_LIFETIME = timedelta(days=366)

_TOKEN_NAME = re.compile(TOKEN_NAME_PATTERN, re.ASCII)
_TOKEN = re.compile(r"^qoss_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


class Unauthenticated(QossError, PermissionError):
    """No valid token (missing, malformed, unknown, expired or revoked): 401, no detail given."""

    def __init__(self) -> None:
        super().__init__("a valid API token is required")


class Forbidden(QossError, PermissionError):
    """A valid token without the needed scope: 403."""

    def __init__(self, scope: str) -> None:
        super().__init__(f"this token lacks the {scope} scope")


@dataclass(frozen=True)
class TokenRecord:
    """What is stored of a token (never the secret)."""

    id: str
    name: str
    scopes: frozenset[str]
    secret_hash: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    #: Who made it (the maker's token or user name, ``cli``); None where not known. Not part of
    #: what a token is: records that differ only here are equal.
    created_by: str | None = field(default=None, compare=False)

    def usable(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def validate_scopes(scopes: Iterable[str]) -> frozenset[str]:
    """Known scopes only."""
    found = frozenset(scopes)
    unknown = found - SCOPES
    if unknown or not found:
        raise InvalidInput(f"scopes must be a non-empty subset of {sorted(SCOPES)}")
    return found


def validate_token_name(name: str) -> str:
    """A new token's name, as POST /v1/tokens and ``qoss token create`` take it.

    Raises:
        InvalidInput: empty, longer than :data:`TOKEN_NAME_MAX_LENGTH`, or not of
            :data:`TOKEN_NAME_PATTERN` (the message does not repeat the name).
    """
    if not 1 <= len(name) <= TOKEN_NAME_MAX_LENGTH or _TOKEN_NAME.fullmatch(name) is None:
        raise InvalidInput(f"a token name is 1-{TOKEN_NAME_MAX_LENGTH} characters: a letter or digit, then "
                           "letters, digits, '.', '_', '@' or '-'")
    return name


def token_lifetime(expires_in: int | None) -> timedelta:
    """How long a new token lives: ``expires_in`` seconds, or :data:`TOKEN_MAX_LIFETIME` when None.

    Raises:
        InvalidInput: less than a second or more than :data:`TOKEN_MAX_LIFETIME`.
    """
    if expires_in is None:
        return TOKEN_MAX_LIFETIME
    if not 1 <= expires_in <= TOKEN_MAX_LIFETIME.total_seconds():
        raise InvalidInput(f"expires_in is 1 second to {TOKEN_MAX_LIFETIME.days} days")
    return timedelta(seconds=expires_in)


def parse_token(presented: str | None) -> tuple[str, str]:
    """(id, secret) of a presented bearer token.

    Raises:
        Unauthenticated: missing or not of the token format.
    """
    if not presented:
        raise Unauthenticated()
    match = _TOKEN.match(presented)
    if match is None:
        raise Unauthenticated()
    return match.group(1), match.group(2)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented secret with the stored hash."""
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def check_scopes(record: TokenRecord, needed: str) -> None:
    """Raises Forbidden unless the token has ``needed`` (or ``admin``)."""
    if needed not in record.scopes and "admin" not in record.scopes:
        raise Forbidden(needed)
