"""Console sessions (pure): the session id a browser holds, what is stored of it, and the
CSRF token bound to it.

A session id is 256 random bits, sent only as an HttpOnly cookie; the database keeps its
SHA-256, so a copy of the database signs no one in. The CSRF token is an HMAC of a fixed
label under the session id: only the holder of the cookie can compute it, nothing more is
stored, and it dies with the session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["SessionRecord", "csrf_matches", "csrf_token", "hash_session_id", "new_session_id", "session_expiry"]

_CSRF_LABEL = b"qoss-console-csrf-v1"


@dataclass(frozen=True)
class SessionRecord:
    """What is stored of a console session: never the id itself.

    A session is an API token's (``token_id``) or, signed in with the identity provider, a
    user's: their ``subject`` at the provider, the name they go by (``user_name``), the
    ``scopes`` the mapping gave them and the fingerprint of that mapping (``mapping_hash``).
    """

    id_hash: str
    token_id: str | None
    created_at: datetime
    expires_at: datetime
    subject: str | None = None
    user_name: str | None = None
    scopes: frozenset[str] | None = None
    mapping_hash: str | None = None

    def live(self, now: datetime) -> bool:
        return now < self.expires_at

    @property
    def holder(self) -> str:
        """Whose session this is, as event streams are counted: the token's id, or ``oidc:<subject>``."""
        return self.token_id if self.token_id is not None else f"oidc:{self.subject}"


def new_session_id() -> str:
    """A fresh session id (43 url-safe characters, 256 bits)."""
    return secrets.token_urlsafe(32)


def hash_session_id(session_id: str) -> str:
    """What the database keeps of a session id (SHA-256, hex)."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).hexdigest()


def csrf_token(session_id: str) -> str:
    """The CSRF token of a session: HMAC-SHA-256 of a fixed label under the session id."""
    return hmac.new(session_id.encode("utf-8", "surrogateescape"), _CSRF_LABEL, hashlib.sha256).hexdigest()


def csrf_matches(session_id: str, presented: str | None) -> bool:
    """Whether ``presented`` is the session's CSRF token (constant time)."""
    return presented is not None and hmac.compare_digest(csrf_token(session_id).encode(), presented.encode())


def session_expiry(now: datetime, ttl: timedelta, token_expires: datetime | None) -> datetime:
    """When a session made ``now`` ends: after ``ttl``, never after its token."""
    end = now + ttl
    return min(end, token_expires) if token_expires is not None else end
