"""Signing in to the console with the organisation's OpenID provider: the redirect there, its
answer, and a console session with exactly the scopes the operator's mapping gives the user.

- :func:`begin`: a new sign-in (its flow cookie and the provider's authorization URL, with
  state, nonce and a PKCE challenge).
- :func:`finish`: the provider's answer: the flow cookie and ``state`` must match, the code is
  redeemed (with the PKCE verifier), the ID token checked (signature, ``iss``, ``aud``,
  ``exp``, ``nonce``), the userinfo read, the claims mapped to scopes. No scope mapped: refused,
  nothing stored. Otherwise a session of the user (no API token), which lives as long as the ID
  token (or ``oidc_session_ttl``), never longer than ``ui_session_ttl``, and holds the
  fingerprint of the mapping: once the mapping, the client or the issuer changes, it is
  refused (:func:`app.services.ui_sessions.resolve`). Nothing is refreshed: a new session needs
  the provider again.

Blocking (the provider is asked over HTTP): call from a worker thread.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.domain.oidc import (
    IdentityProvider,
    IdTokenRefused,
    NoScopeMapped,
    ScopeMapping,
    SignInRefused,
    mapped_scopes,
    new_flow,
    open_flow,
    user_name,
)
from app.domain.ports import UnitOfWork
from app.domain.sessions import SessionRecord, hash_session_id, new_session_id

__all__ = ["OidcSignIn", "SignedIn", "begin", "finish", "flow_key"]

_FLOW_KEY = "console-oidc"
_ERROR = re.compile(r"^[a-z_]{1,40}$")
_MAX_SUBJECT = 255


@dataclass(frozen=True)
class OidcSignIn:
    """The console's sign-in with the provider, as configured.

    Attributes:
        provider: the provider (port).
        name: what the sign-in button calls it.
        mapping: claim → value → scopes.
        fingerprint: of the issuer, the client and the mapping (:func:`app.domain.oidc.mapping_fingerprint`).
        request_scopes: the OpenID scopes asked for.
        max_ttl: the longest a console session lasts (``ui_session_ttl``).
        session_ttl: how long a user's session lasts (None: as long as the ID token).
        redirect_url: the registered redirect URL (None: from the request).
    """

    provider: IdentityProvider
    name: str
    mapping: ScopeMapping
    fingerprint: str
    request_scopes: tuple[str, ...]
    max_ttl: timedelta
    session_ttl: timedelta | None
    redirect_url: str | None


@dataclass(frozen=True)
class SignedIn:
    """A new session of a user: its id (for the cookie, not stored) and its record."""

    session_id: str
    record: SessionRecord

    @property
    def name(self) -> str:
        return self.record.user_name or ""


def flow_key(uow: UnitOfWork) -> bytes:
    """This database's key for the sign-in flows: 32 random bytes, made by the first caller."""
    return bytes.fromhex(uow.server_keys.get_or_create(_FLOW_KEY, lambda: secrets.token_hex(32)))


def begin(*, config: OidcSignIn, key: bytes, redirect_uri: str, now: float | None = None) -> tuple[str, str]:
    """A new sign-in: the flow cookie for the browser and the provider's URL to send it to.

    Raises:
        ProviderUnavailable: the provider's discovery document cannot be read.
    """
    cookie, flow = new_flow(key, now=time.time() if now is None else now)
    return cookie, config.provider.authorization_url(flow=flow, redirect_uri=redirect_uri,
                                                     scopes=config.request_scopes)


def finish(*, uow: UnitOfWork, config: OidcSignIn, key: bytes, cookie: str | None, answer: Mapping[str, str],
           redirect_uri: str, now: datetime | None = None) -> SignedIn:
    """The provider's answer (the callback's query) made a session, or refused.

    Raises:
        SignInRefused: no flow cookie (expired, or another browser), a ``state`` that is not
            the flow's, the provider's own ``error``, no code.
        IdTokenRefused: the ID token fails a check.
        NoScopeMapped: the mapping gives the user no scope (nothing is stored).
        ProviderUnavailable: the provider does not answer, or refuses the code.
    """
    at = now or datetime.now(UTC)
    flow = open_flow(key, cookie, now=at.timestamp())
    if flow is None:
        raise SignInRefused("This sign-in has expired or was started in another browser: sign in again.")
    error = answer.get("error", "")
    if error:
        said = error if _ERROR.fullmatch(error) else "an error"
        raise SignInRefused(f"The identity provider did not sign you in ({said}).")
    state = answer.get("state", "")
    if not hmac.compare_digest(state.encode("utf-8", "replace"), flow.state.encode("ascii")):
        raise SignInRefused("This answer is not of the sign-in this browser started (state): sign in again.")
    code = answer.get("code", "")
    if not code or len(code) > 2048:
        raise SignInRefused("The identity provider's answer has no code: sign in again.")
    id_token, access_token = config.provider.redeem(code=code, flow=flow, redirect_uri=redirect_uri)
    claims = config.provider.id_token_claims(id_token, nonce=flow.nonce)
    subject = str(claims["sub"])
    if len(subject) > _MAX_SUBJECT:
        raise IdTokenRefused(f"the identity provider's subject is longer than {_MAX_SUBJECT} characters")
    extra = config.provider.userinfo(access_token, subject=subject) if access_token else {}
    merged = {**extra, **claims}  # the signed claims win where both say something
    name = user_name(merged)
    scopes = mapped_scopes(config.mapping, merged)
    if not scopes:
        raise NoScopeMapped(name)
    lasts = config.session_ttl or (datetime.fromtimestamp(int(claims["exp"]), UTC) - at)
    session_id = new_session_id()
    record = SessionRecord(id_hash=hash_session_id(session_id), token_id=None, created_at=at,
                           expires_at=at + min(config.max_ttl, lasts), subject=subject, user_name=name,
                           scopes=scopes, mapping_hash=config.fingerprint)
    uow.sessions.delete_ended(at)
    uow.sessions.add(record)
    return SignedIn(session_id, record)
