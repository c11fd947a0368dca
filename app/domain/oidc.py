"""Signing in to the console with the organisation's OpenID provider (pure).

- Which qoss scopes a user's claims give (:func:`mapped_scopes`), under the operator's mapping
  (:func:`parse_mapping`: claim → value → scopes), and the fingerprint of that mapping a session
  is granted under (:func:`mapping_fingerprint`): a session whose mapping has changed since is
  refused.
- The name a user goes by in the console, in revisions and in the audit log (:func:`user_name`).
- One sign-in's secrets: ``state``, ``nonce`` and the PKCE verifier, each an HMAC of a random
  flow id under a server key (:func:`new_flow`, :func:`open_flow`). The browser holds only the
  flow id (``id.expiry.mac``, in a short-lived cookie): nothing is stored between the redirect
  to the provider and its answer, and nothing in the cookie is one of the secrets.

::

    QossError
    ├── SignInRefused (PermissionError)        the provider's answer signs no one in
    │   ├── IdTokenRefused                     the ID token failed a check (signature, iss, aud, exp, nonce)
    │   └── NoScopeMapped                      signed in at the provider, but the mapping gives no scope (403)
    └── ProviderUnavailable (ConnectionError)  the provider does not answer, or not as OpenID Connect says (502)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.domain.auth import SCOPES
from app.domain.errors import QossError

__all__ = [
    "FLOW_TTL",
    "USER_NAME_MAX_LENGTH",
    "Flow",
    "IdTokenRefused",
    "IdentityProvider",
    "NoScopeMapped",
    "ProviderUnavailable",
    "ScopeMapping",
    "SignInRefused",
    "mapped_scopes",
    "mapping_fingerprint",
    "new_flow",
    "open_flow",
    "parse_mapping",
    "user_name",
]

#: claim → value → the qoss scopes a user with that value of that claim gets.
ScopeMapping = Mapping[str, Mapping[str, frozenset[str]]]

#: Seconds a sign-in may take at the provider (from the redirect there to its answer).
FLOW_TTL = 600
#: The longest name a user goes by (as a token's name is stored in the audit log).
USER_NAME_MAX_LENGTH = 64

_FLOW_CONTEXT = b"qoss console oidc flow\x00"
_MAX_CLAIM = 255


class SignInRefused(QossError, PermissionError):
    """The provider's answer signs no one in. ``reason`` is shown on the page; it names no secret."""


class IdTokenRefused(SignInRefused):
    """The ID token failed a check: its signature, issuer, audience, expiry or nonce."""


class NoScopeMapped(SignInRefused):
    """Signed in at the provider, but no entry of the mapping matches the user's claims: no session."""

    def __init__(self, user: str) -> None:
        super().__init__(f"{user} signed in at the identity provider, but no qoss scope is mapped to them")
        self.user = user


class ProviderUnavailable(QossError, ConnectionError):
    """The provider does not answer, or answers not as OpenID Connect says."""


class IdentityProvider(Protocol):
    """The port to the provider (:class:`app.adapters.oidc.OidcProvider`); blocking calls."""

    issuer: str
    client_id: str

    def authorization_url(self, *, flow: Flow, redirect_uri: str, scopes: Iterable[str]) -> str: ...

    def redeem(self, *, code: str, flow: Flow, redirect_uri: str) -> tuple[str, str | None]:
        """(ID token, access token) for an authorization code."""
        ...

    def id_token_claims(self, id_token: str, *, nonce: str) -> dict[str, Any]:
        """The claims of an ID token that passed every check."""
        ...

    def userinfo(self, access_token: str, *, subject: str) -> dict[str, Any]: ...

    def end_session_url(self, *, post_logout_redirect_uri: str) -> str | None: ...


def parse_mapping(raw: object) -> dict[str, dict[str, frozenset[str]]]:
    """The operator's mapping, from JSON text or a dict: ``{claim: {value: [scope, ...]}}``.

    Raises:
        ValueError: not JSON, not of that shape, an empty claim or value, or an unknown scope
            (one line, naming the entry).
    """
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError('a JSON object {"claim": {"value": ["scope", ...]}} is expected')
    mapping: dict[str, dict[str, frozenset[str]]] = {}
    for claim, values in raw.items():
        if not isinstance(claim, str) or not claim or len(claim) > _MAX_CLAIM:
            raise ValueError(f"claim name {str(claim)[:40]!r} is empty or too long")
        if not isinstance(values, dict) or not values:
            raise ValueError(f'claim {claim!r}: a non-empty object {{"value": ["scope", ...]}} is expected')
        mapping[claim] = {}
        for value, scopes in values.items():
            if not value or len(value) > _MAX_CLAIM:
                raise ValueError(f"claim {claim!r}: value {value[:40]!r} is empty or too long")
            if (not isinstance(scopes, list) or not scopes
                    or not all(isinstance(s, str) for s in scopes)):
                raise ValueError(f"{claim} {value!r}: a non-empty list of scopes is expected")
            unknown = sorted(set(scopes) - SCOPES)
            if unknown:
                raise ValueError(f"{claim} {value!r}: unknown scope {unknown[0]!r} (known: "
                                 f"{', '.join(sorted(SCOPES))})")
            mapping[claim][value] = frozenset(scopes)
    return mapping


def _values(claim: str, claims: Mapping[str, Any]) -> set[str]:
    """The values a user has of ``claim``: a string, each string of a list, the keys of an object
    (roles as some providers give them). ``email`` counts only when ``email_verified`` is true."""
    value = claims.get(claim)
    if claim == "email" and claims.get("email_verified") is not True:
        return set()
    if isinstance(value, str):
        found = {value}
    elif isinstance(value, list):
        found = {v for v in value if isinstance(v, str)}
    elif isinstance(value, dict):
        found = {k for k in value if isinstance(k, str)}
    else:
        return set()
    return {v.casefold() for v in found} if claim == "email" else found


def mapped_scopes(mapping: ScopeMapping, claims: Mapping[str, Any]) -> frozenset[str]:
    """Every scope the mapping gives a user with ``claims``: the union over each claim and each of
    its values that the mapping names. Values match exactly; an email address in any case, and
    only a verified one."""
    granted: set[str] = set()
    for claim, values in mapping.items():
        have = _values(claim, claims)
        for value, scopes in values.items():
            if (value.casefold() if claim == "email" else value) in have:
                granted |= scopes
    return frozenset(granted)


def mapping_fingerprint(*, issuer: str, client_id: str, mapping: ScopeMapping) -> str:
    """SHA-256 (hex) of the issuer, the client and the mapping, in canonical form: what a session
    is granted under. Changing any of them ends every session granted under the old one."""
    canonical = {"issuer": issuer, "client_id": client_id,
                 "mapping": {c: {v: sorted(s) for v, s in values.items()} for c, values in mapping.items()}}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def user_name(claims: Mapping[str, Any]) -> str:
    """The name a user goes by: a verified email address, else ``preferred_username``, else the
    subject; printable, at most :data:`USER_NAME_MAX_LENGTH` characters."""
    email = claims.get("email") if claims.get("email_verified") is True else None
    for candidate in (email, claims.get("preferred_username"), claims.get("sub")):
        if isinstance(candidate, str):
            cleaned = "".join(ch for ch in candidate if ch.isprintable()).strip()
            if cleaned:
                return cleaned[:USER_NAME_MAX_LENGTH]
    return "unknown"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _derive(key: bytes, label: str, flow_id: str) -> str:
    return _b64(hmac.new(key, _FLOW_CONTEXT + label.encode() + b"\x00" + flow_id.encode("ascii"),
                         hashlib.sha256).digest())


@dataclass(frozen=True)
class Flow:
    """One sign-in's secrets, derived from its flow id under the server's key."""

    state: str
    nonce: str
    verifier: str

    @property
    def challenge(self) -> str:
        """The PKCE ``code_challenge`` (S256) of the verifier."""
        return _b64(hashlib.sha256(self.verifier.encode("ascii")).digest())

    @classmethod
    def of(cls, key: bytes, flow_id: str) -> Flow:
        return cls(state=_derive(key, "state", flow_id), nonce=_derive(key, "nonce", flow_id),
                   verifier=_derive(key, "pkce", flow_id))


def new_flow(key: bytes, *, now: float) -> tuple[str, Flow]:
    """A new sign-in: the browser's cookie (``id.expiry.mac``, good for :data:`FLOW_TTL` seconds
    from ``now``) and the sign-in's secrets."""
    flow_id = secrets.token_urlsafe(24)
    body = f"{flow_id}.{int(now) + FLOW_TTL}"
    return f"{body}.{_derive(key, 'cookie', body)}", Flow.of(key, flow_id)


def open_flow(key: bytes, cookie: str | None, *, now: float) -> Flow | None:
    """The secrets of the sign-in a cookie from :func:`new_flow` holds; None if it is not one this
    key made, or it has expired."""
    if not cookie or len(cookie) > 200 or not cookie.isascii():
        return None
    body, dot, mac = cookie.rpartition(".")
    flow_id, _, expires = body.rpartition(".")
    if not dot or not flow_id or not expires.isdigit():
        return None
    if not hmac.compare_digest(mac.encode("ascii"), _derive(key, "cookie", body).encode("ascii")):
        return None
    if not now <= int(expires) <= now + FLOW_TTL:
        return None
    return Flow.of(key, flow_id)
