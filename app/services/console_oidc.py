"""Signing in to the console with the organisation's OpenID provider: the redirect there, its
answer, and a console session with exactly the scopes the operator's mapping gives the user.

- :func:`begin`: a new sign-in (its flow cookie and the provider's authorization URL, with
  state, nonce and a PKCE challenge), bound to the value the console's sign-in page keeps in
  the browser (:func:`app.domain.oidc.new_flow`).
- :func:`verify`: the provider's answer: the flow cookie, the binding and ``state`` must match,
  and the state must not have been answered before (:class:`~app.domain.oidc.UsedStates`);
  only then is the code redeemed (with the PKCE verifier), the ID token checked (signature,
  ``iss``, ``aud``, ``exp``, ``nonce``), the userinfo read, the claims mapped to scopes. No
  scope mapped: refused.
- :func:`open_session`: the session of a user :func:`verify` let in (no API token), which lives
  as long as the ID token (or ``oidc_session_ttl``), never longer than ``ui_session_ttl``, and
  holds the fingerprint of the mapping: once the mapping, the client or the issuer changes, it
  is refused (:func:`app.services.ui_sessions.resolve`). Nothing is refreshed: a new session
  needs the provider again.

Only :func:`open_session` touches the database, and it asks nothing of the provider: no
transaction is open while the provider is asked. :func:`begin` and :func:`verify` are blocking
(the provider is asked over HTTP): call them from a worker thread.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from app.domain.oidc import (
    IdentityProvider,
    IdTokenRefused,
    NoScopeMapped,
    ScopeMapping,
    SignInRefused,
    UsedStates,
    agent_user_id,
    mapped_scopes,
    new_flow,
    open_flow,
    user_name,
)
from app.domain.ports import UnitOfWork
from app.domain.sessions import SessionRecord, hash_session_id, new_session_id

__all__ = ["KeyCache", "OidcSignIn", "ProviderUser", "SignedIn", "begin", "flow_key", "open_session", "verify"]

_FLOW_KEY = "console-oidc"
_ERROR = re.compile(r"^[a-z_]{1,40}$")
_MAX_SUBJECT = 255


class KeyCache:
    """Keys of this database (each made once, never changed), kept in this process once read, so
    that a sign-in needs no transaction for them after the first."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> bytes | None:
        with self._lock:
            return self._keys.get(name)

    def keep(self, name: str, key: bytes) -> None:
        with self._lock:
            self._keys.setdefault(name, key)


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
        redirect_url: the registered redirect URL (the console's public address).
        used: the states answered already, in this process.
        keys: the database's keys, once read.
    """

    provider: IdentityProvider
    name: str
    mapping: ScopeMapping
    fingerprint: str
    request_scopes: tuple[str, ...]
    max_ttl: timedelta
    session_ttl: timedelta | None
    redirect_url: str
    used: UsedStates = field(default_factory=UsedStates, compare=False, repr=False)
    keys: KeyCache = field(default_factory=lambda: KeyCache(), compare=False, repr=False)


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


def begin(*, config: OidcSignIn, key: bytes, binding: str, redirect_uri: str,
          now: float | None = None) -> tuple[str, str]:
    """A new sign-in: the flow cookie for the browser and the provider's URL to send it to.

    Raises:
        SignInRefused: ``binding`` is not of the shape the sign-in page makes.
        ProviderUnavailable: the provider's discovery document cannot be read.
    """
    try:
        cookie, flow = new_flow(key, binding=binding, now=time.time() if now is None else now)
    except ValueError as exc:
        raise SignInRefused("This sign-in did not come from the console's sign-in page: sign in again.") from exc
    return cookie, config.provider.authorization_url(flow=flow, redirect_uri=redirect_uri,
                                                     scopes=config.request_scopes)


@dataclass(frozen=True)
class ProviderUser:
    """A user the provider signed in and the mapping gives scopes: what a session is made of.

    Attributes:
        subject: the ID token's ``sub``.
        name: the name they go by here (:func:`app.domain.oidc.user_name`: ``oidc:...``).
        scopes: what the mapping gives them (never empty).
        token_expires: when the ID token expires.
        agent_user: the tunnel agent's user id they enrol devices as
            (:func:`app.domain.oidc.agent_user_id`; None: their claims name none).
    """

    subject: str
    name: str
    scopes: frozenset[str]
    token_expires: datetime
    agent_user: str | None = None


def verify(*, config: OidcSignIn, key: bytes, cookie: str | None, binding: str, answer: Mapping[str, str],
           redirect_uri: str, now: datetime | None = None) -> ProviderUser:
    """The provider's answer (the callback's fields) checked, and the user it signs in.

    Everything that needs no provider is checked first; the state is then taken (once); only
    then is the provider asked.

    Raises:
        SignInRefused: no flow cookie (expired, or another browser), a binding that is not the
            one this browser's sign-in page made, a ``state`` that is not the flow's, a state
            answered before, the provider's own ``error``, no code.
        IdTokenRefused: the ID token fails a check.
        NoScopeMapped: the mapping gives the user no scope.
        ProviderUnavailable: the provider does not answer, or refuses the code.
    """
    at = now or datetime.now(UTC)
    flow = open_flow(key, cookie, binding=binding, now=at.timestamp())
    if flow is None:
        raise SignInRefused("This sign-in has expired or was started in another browser: sign in again.")
    state = answer.get("state", "")
    if not hmac.compare_digest(state.encode("utf-8", "replace"), flow.state.encode("ascii")):
        raise SignInRefused("This answer is not of the sign-in this browser started (state): sign in again.")
    if not config.used.take(flow, now=at.timestamp()):
        raise SignInRefused("This sign-in has been answered already: sign in again.")
    error = answer.get("error", "")
    if error:
        said = error if _ERROR.fullmatch(error) else "an error"
        raise SignInRefused(f"The identity provider did not sign you in ({said}).")
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
    return ProviderUser(subject=subject, name=name, scopes=scopes,
                        token_expires=datetime.fromtimestamp(int(claims["exp"]), UTC),
                        agent_user=agent_user_id(merged))


def open_session(*, uow: UnitOfWork, config: OidcSignIn, user: ProviderUser, now: datetime | None = None) -> SignedIn:
    """A console session of ``user`` (from :func:`verify`), stored in ``uow`` (the caller commits)."""
    at = now or datetime.now(UTC)
    lasts = config.session_ttl or (user.token_expires - at)
    session_id = new_session_id()
    record = SessionRecord(id_hash=hash_session_id(session_id), token_id=None, created_at=at,
                           expires_at=at + min(config.max_ttl, lasts), subject=user.subject, user_name=user.name,
                           scopes=user.scopes, mapping_hash=config.fingerprint)
    uow.sessions.delete_ended(at)
    uow.sessions.add(record)
    return SignedIn(session_id, record)
