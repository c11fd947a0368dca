"""Signing in to the console with the organisation's OpenID provider (pure).

- Which qoss scopes a user's claims give (:func:`mapped_scopes`), under the operator's mapping
  (:func:`parse_mapping`: claim → value → scopes), and the fingerprint of that mapping a session
  is granted under (:func:`mapping_fingerprint`): a session whose mapping has changed since is
  refused.
- The name a user goes by in the console, in revisions and in the audit log (:func:`user_name`):
  always ``oidc:`` and the provider's name for them, so that it can never be taken for an API
  token's name (which has no ``:``).
- One sign-in's secrets: ``state``, ``nonce`` and the PKCE verifier, each an HMAC of a random
  flow id under a server key (:func:`new_flow`, :func:`open_flow`). The browser holds the flow
  id (``id.expiry.mac``, in a short-lived cookie) and, in the console's own ``sessionStorage``,
  the binding the cookie's MAC covers (:func:`valid_binding`): a cookie planted from another
  origin is worthless without the binding that only this origin's page holds. Nothing in the
  cookie is one of the secrets.
- The sign-ins already answered (:class:`UsedStates`): a ``state`` is taken once.

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
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.domain.auth import SCOPES
from app.domain.errors import QossError

__all__ = [
    "DEVICE_SCOPE",
    "FLOW_TTL",
    "USER_NAME_MAX_LENGTH",
    "USER_NAME_PREFIX",
    "Flow",
    "IdTokenRefused",
    "IdentityProvider",
    "NoScopeMapped",
    "ProviderUnavailable",
    "ScopeMapping",
    "SignInRefused",
    "UsedStates",
    "agent_user_id",
    "email_key",
    "mapped_scopes",
    "mapping_fingerprint",
    "new_flow",
    "open_flow",
    "parse_mapping",
    "user_name",
    "valid_binding",
]

#: claim → value → the qoss scopes a user with that value of that claim gets.
ScopeMapping = Mapping[str, Mapping[str, frozenset[str]]]

#: Seconds a sign-in may take at the provider (from the redirect there to its answer).
FLOW_TTL = 600
#: The longest name a user goes by (as a token's name is stored in the audit log), prefix included.
USER_NAME_MAX_LENGTH = 64
#: What every name of the provider's users starts with: no API token's name has a ``:``.
USER_NAME_PREFIX = "oidc:"
#: The scope that lets a person signed in with the provider enrol a device of their own from the
#: phone's page (as one invitation for their own user id would: :func:`agent_user_id`).
DEVICE_SCOPE = "agent:enroll-device"
_AGENT_USER = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")

_FLOW_CONTEXT = b"qoss console oidc flow\x00"
_MAX_CLAIM = 255
_BINDING = re.compile(r"^[A-Za-z0-9_-]{43}$")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


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


def email_key(address: str) -> str:
    """An email address as the mapping compares it: exactly as given, but for the ASCII letters of
    its domain, in lower case (a domain is case-insensitive; a local part may not be, and no other
    folding is done: ``\\u212aim@example.com`` is not ``kim@example.com``)."""
    local, at, domain = address.rpartition("@")
    return f"{local}{at}{domain.translate(_ASCII_LOWER)}" if at else address


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
    return {email_key(v) for v in found} if claim == "email" else found


def mapped_scopes(mapping: ScopeMapping, claims: Mapping[str, Any]) -> frozenset[str]:
    """Every scope the mapping gives a user with ``claims``: the union over each claim and each of
    its values that the mapping names. Values match exactly; an email address only when verified,
    and exactly but for the case of its domain's ASCII letters (:func:`email_key`)."""
    granted: set[str] = set()
    for claim, values in mapping.items():
        have = _values(claim, claims)
        for value, scopes in values.items():
            if (email_key(value) if claim == "email" else value) in have:
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
    """The name a user goes by: :data:`USER_NAME_PREFIX` and a verified email address, else
    ``preferred_username``, else the subject; printable, at most :data:`USER_NAME_MAX_LENGTH`
    characters in all. The prefix keeps it apart from every API token's name: a user who calls
    themselves ``admin`` at the provider is ``oidc:admin`` here."""
    email = claims.get("email") if claims.get("email_verified") is True else None
    room = USER_NAME_MAX_LENGTH - len(USER_NAME_PREFIX)
    for candidate in (email, claims.get("preferred_username"), claims.get("sub")):
        if isinstance(candidate, str):
            cleaned = "".join(ch for ch in candidate if ch.isprintable()).strip()
            if cleaned:
                return USER_NAME_PREFIX + cleaned[:room]
    return USER_NAME_PREFIX + "unknown"


def agent_user_id(claims: Mapping[str, Any]) -> str | None:
    """The tunnel agent's user id a person signed in with the provider enrols their devices as:
    their ``preferred_username``, else the part before the ``@`` of a verified email address, in
    lower case, if it is an agent user id (1-63 of ``a-z 0-9 . _ -``, starting with a letter or a
    digit); None if neither is one."""
    email = claims.get("email") if claims.get("email_verified") is True else None
    local = email.rpartition("@")[0] if isinstance(email, str) and "@" in email else None
    for candidate in (claims.get("preferred_username"), local):
        if isinstance(candidate, str) and candidate.isascii():
            lowered = candidate.strip().translate(_ASCII_LOWER)
            if _AGENT_USER.fullmatch(lowered):
                return lowered
    return None


def valid_binding(binding: str) -> bool:
    """Whether ``binding`` is of the shape the console's sign-in page makes: 32 random bytes,
    base64url without padding (43 characters)."""
    return _BINDING.fullmatch(binding) is not None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _derive(key: bytes, label: str, flow_id: str) -> str:
    return _b64(hmac.new(key, _FLOW_CONTEXT + label.encode() + b"\x00" + flow_id.encode("ascii"),
                         hashlib.sha256).digest())


@dataclass(frozen=True)
class Flow:
    """One sign-in's secrets, derived from its flow id under the server's key, and when it ends
    (seconds since the epoch)."""

    state: str
    nonce: str
    verifier: str
    expires: int = 0

    @property
    def challenge(self) -> str:
        """The PKCE ``code_challenge`` (S256) of the verifier."""
        return _b64(hashlib.sha256(self.verifier.encode("ascii")).digest())

    @classmethod
    def of(cls, key: bytes, flow_id: str, expires: int = 0) -> Flow:
        return cls(state=_derive(key, "state", flow_id), nonce=_derive(key, "nonce", flow_id),
                   verifier=_derive(key, "pkce", flow_id), expires=expires)


def _cookie_mac(key: bytes, body: str, binding: str) -> str:
    bound = hashlib.sha256(binding.encode("ascii")).hexdigest()
    return _derive(key, "cookie", f"{body}.{bound}")


def new_flow(key: bytes, *, binding: str, now: float) -> tuple[str, Flow]:
    """A new sign-in: the browser's cookie (``id.expiry.mac``, good for :data:`FLOW_TTL` seconds
    from ``now``, its MAC over ``binding`` too) and the sign-in's secrets.

    Raises:
        ValueError: ``binding`` is not of the shape :func:`valid_binding` takes.
    """
    if not valid_binding(binding):
        raise ValueError("the sign-in's binding is not 43 characters of base64url")
    flow_id = secrets.token_urlsafe(24)
    expires = int(now) + FLOW_TTL
    body = f"{flow_id}.{expires}"
    return f"{body}.{_cookie_mac(key, body, binding)}", Flow.of(key, flow_id, expires)


def open_flow(key: bytes, cookie: str | None, *, binding: str, now: float) -> Flow | None:
    """The secrets of the sign-in a cookie from :func:`new_flow` holds; None if it is not one this
    key made with this ``binding``, or it has expired."""
    if not cookie or len(cookie) > 200 or not cookie.isascii() or not valid_binding(binding):
        return None
    body, dot, mac = cookie.rpartition(".")
    flow_id, _, expires = body.rpartition(".")
    if not dot or not flow_id or not expires.isdigit():
        return None
    if not hmac.compare_digest(mac.encode("ascii"), _cookie_mac(key, body, binding).encode("ascii")):
        return None
    if not now <= int(expires) <= now + FLOW_TTL:
        return None
    return Flow.of(key, flow_id, int(expires))


class UsedStates:
    """The sign-ins this process has taken an answer for, each until its flow expires: a
    ``state`` is taken once, so a replayed answer is refused before the provider is asked.

    Held in this process's memory (replicas do not share it; the provider's own rule that an
    authorization code is redeemed once stands behind it there). At most ``capacity`` entries:
    past that the oldest is forgotten first.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, flow: Flow, *, now: float) -> bool:
        """Note ``flow``'s state as used; False if it was already (a replay)."""
        digest = hashlib.sha256(flow.state.encode("ascii")).hexdigest()
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now:
                self._seen.popitem(last=False)  # the oldest first, while it has ended
            if digest in self._seen:
                return False
            self._seen[digest] = flow.expires
            while len(self._seen) > self._capacity:
                self._seen.popitem(last=False)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)
