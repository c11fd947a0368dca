"""The organisation's OpenID provider, as the console's sign-in speaks to it (blocking: call from
a worker thread).

- Its discovery document (``/.well-known/openid-configuration``), read when first needed and
  kept for an hour; its ``issuer`` must be the configured one, exactly.
- Its keys (``jwks_uri``) through PyJWT's :class:`jwt.PyJWKClient`, kept for five minutes and
  read again for a key id it does not know (the provider rotated its keys).
- Every request to it bounded: ``timeout`` seconds each, and at most ``in_flight`` of them at
  once in this process; one more is refused at once (a provider that does not answer holds a
  few worker threads, never all of them).
- The authorization code flow with PKCE (S256), ``state`` and ``nonce``; the code redeemed at
  the token endpoint with the client's secret (HTTP Basic, or in the form where the provider
  takes only that); the ID token checked (:func:`verify_id_token`); the userinfo endpoint read
  for claims the ID token leaves out (its ``sub`` must be the ID token's).

Every failure to reach the provider, or an answer that is not what OpenID Connect says, is
:class:`~app.domain.oidc.ProviderUnavailable`, chained; an ID token that fails a check is
:class:`~app.domain.oidc.IdTokenRefused`. Neither message carries a code, a token or the secret.
"""

from __future__ import annotations

import contextlib
import hmac
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import jwt

from app.domain.oidc import Flow, IdTokenRefused, ProviderUnavailable

__all__ = ["ASYMMETRIC_ALGORITHMS", "OidcProvider", "ProviderMetadata", "verify_id_token"]

#: The signature algorithms an ID token may use: asymmetric ones only (never ``none``, never an
#: HMAC keyed with the client's secret).
ASYMMETRIC_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                   "ES256", "ES384", "ES512", "EdDSA"})
_METADATA_TTL = 3600.0
_MAX_ANSWER = 1_048_576


@dataclass(frozen=True)
class ProviderMetadata:
    """What qoss reads of a provider's discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    end_session_endpoint: str | None
    algorithms: frozenset[str]
    basic_auth: bool

    @classmethod
    def from_document(cls, document: dict[str, Any], issuer: str) -> ProviderMetadata:
        """Raises:
            ProviderUnavailable: the document's issuer is not ``issuer``, or an endpoint is missing.
        """
        if document.get("issuer") != issuer:
            raise ProviderUnavailable(f"the provider's discovery document names issuer "
                                      f"{str(document.get('issuer'))[:100]!r}, not {issuer!r}")
        needed = {}
        for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            value = document.get(name)
            if not isinstance(value, str) or not value.startswith(("https://", "http://")):
                raise ProviderUnavailable(f"the provider's discovery document has no {name}")
            needed[name] = value
        offered = document.get("id_token_signing_alg_values_supported")
        algorithms = (frozenset(a for a in offered if isinstance(a, str)) if isinstance(offered, list)
                      else frozenset({"RS256"})) & ASYMMETRIC_ALGORITHMS
        if not algorithms:
            raise ProviderUnavailable("the provider signs ID tokens with no algorithm qoss accepts "
                                      f"({', '.join(sorted(ASYMMETRIC_ALGORITHMS))})")
        methods = document.get("token_endpoint_auth_methods_supported")
        basic = not isinstance(methods, list) or "client_secret_basic" in methods
        optional = {n: v if isinstance(v := document.get(n), str) and v.startswith(("https://", "http://")) else None
                    for n in ("userinfo_endpoint", "end_session_endpoint")}
        return cls(issuer=issuer, authorization_endpoint=needed["authorization_endpoint"],
                   token_endpoint=needed["token_endpoint"], jwks_uri=needed["jwks_uri"],
                   userinfo_endpoint=optional["userinfo_endpoint"],
                   end_session_endpoint=optional["end_session_endpoint"], algorithms=algorithms, basic_auth=basic)


def verify_id_token(id_token: str, *, key: Any, issuer: str, client_id: str, nonce: str,
                    algorithms: Iterable[str], leeway: float = 60.0) -> dict[str, Any]:
    """The claims of an ID token that passes every check OpenID Connect Core (3.1.3.7) asks of a
    client: its signature under ``key`` with one of ``algorithms`` (asymmetric ones only), ``iss``
    equal to ``issuer``, ``aud`` holding ``client_id`` (and ``azp`` equal to it when there are
    several), ``exp`` in the future and ``iat`` present (``leeway`` seconds of clock skew), a
    ``sub``, and ``nonce`` equal to this sign-in's.

    Raises:
        IdTokenRefused: any check fails (the message says which, never the token).
    """
    allowed = sorted(set(algorithms) & ASYMMETRIC_ALGORITHMS)
    try:
        claims: dict[str, Any] = jwt.decode(
            id_token, key=key, algorithms=allowed, audience=client_id, issuer=issuer, leeway=leeway,
            options={"require": ["iss", "aud", "exp", "iat", "sub"], "verify_signature": True})
    except jwt.ExpiredSignatureError as exc:
        raise IdTokenRefused("the identity provider's ID token has expired") from exc
    except jwt.InvalidAudienceError as exc:
        raise IdTokenRefused("the identity provider's ID token is not for this console (aud)") from exc
    except jwt.InvalidIssuerError as exc:
        raise IdTokenRefused("the identity provider's ID token is from another issuer (iss)") from exc
    except jwt.InvalidSignatureError as exc:
        raise IdTokenRefused("the identity provider's ID token has a bad signature") from exc
    except jwt.PyJWTError as exc:
        raise IdTokenRefused(f"the identity provider's ID token is not valid ({type(exc).__name__})") from exc
    audience = claims["aud"]
    if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != client_id:
        raise IdTokenRefused("the identity provider's ID token is for several clients, none authorised as this one")
    presented = claims.get("nonce")
    if not isinstance(presented, str) or not hmac.compare_digest(presented.encode(), nonce.encode()):
        raise IdTokenRefused("the identity provider's ID token is not of this sign-in (nonce)")
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise IdTokenRefused("the identity provider's ID token names no subject")
    return claims


class OidcProvider:
    """One OpenID provider and this console's client at it.

    Args:
        issuer: the provider's issuer URL, exactly as its discovery document names it.
        client_id: this console's client id there.
        client_secret: its secret (None: a public client, PKCE alone).
        http: the seam for tests; a new :class:`httpx.Client` per call by default.
        timeout: seconds each request to the provider may take.
        in_flight: requests to the provider at once, at most (one more is ProviderUnavailable at once).
        jwks_client: makes the key fetcher for a ``jwks_uri`` (default :class:`jwt.PyJWKClient`).
    """

    def __init__(self, *, issuer: str, client_id: str, client_secret: str | None, http: httpx.Client | None = None,
                 timeout: float = 3.0, in_flight: int = 8,
                 jwks_client: Callable[[str], jwt.PyJWKClient] | None = None) -> None:
        self.issuer = issuer
        self.client_id = client_id
        self._secret = client_secret
        self._http = http
        self._timeout = timeout
        self._jwks_client = jwks_client or (lambda uri: jwt.PyJWKClient(uri, cache_keys=True, lifespan=300,
                                                                        timeout=timeout))
        self._lock = threading.Lock()
        self._in_flight = threading.BoundedSemaphore(in_flight)
        self._metadata: tuple[float, ProviderMetadata] | None = None
        self._keys: tuple[str, jwt.PyJWKClient] | None = None

    def __repr__(self) -> str:  # never the secret
        return f"OidcProvider(issuer={self.issuer!r}, client_id={self.client_id!r})"

    @contextlib.contextmanager
    def _place(self) -> Iterator[None]:
        """One of the ``in_flight`` places of the requests to the provider, or ProviderUnavailable."""
        if not self._in_flight.acquire(blocking=False):
            raise ProviderUnavailable("the identity provider is slow to answer: too many sign-ins are waiting on it")
        try:
            yield
        finally:
            self._in_flight.release()

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        with self._place():
            return self._send(method, url, **kwargs)

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            if self._http is not None:
                answer = self._http.request(method, url, timeout=self._timeout, **kwargs)
            else:
                with httpx.Client(timeout=self._timeout, follow_redirects=False) as client:
                    answer = client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(f"the identity provider does not answer at {url} "
                                      f"({type(exc).__name__})") from exc
        if len(answer.content) > _MAX_ANSWER:
            raise ProviderUnavailable(f"the identity provider's answer at {url} is too large")
        return answer

    def _json(self, answer: httpx.Response, what: str) -> dict[str, Any]:
        try:
            document = answer.json()
        except ValueError as exc:
            raise ProviderUnavailable(f"the identity provider's {what} is not JSON "
                                      f"(HTTP {answer.status_code})") from exc
        if not isinstance(document, dict):
            raise ProviderUnavailable(f"the identity provider's {what} is not a JSON object")
        return document

    def metadata(self) -> ProviderMetadata:
        """The provider's discovery document, read at most once an hour.

        Raises:
            ProviderUnavailable: it cannot be read, or is not the configured issuer's.
        """
        with self._lock:
            if self._metadata is not None and time.monotonic() - self._metadata[0] < _METADATA_TTL:
                return self._metadata[1]
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        answer = self._request("GET", url, headers={"Accept": "application/json"})
        if answer.status_code != 200:
            raise ProviderUnavailable(f"the identity provider's discovery document at {url} answered "
                                      f"HTTP {answer.status_code}")
        found = ProviderMetadata.from_document(self._json(answer, "discovery document"), self.issuer)
        with self._lock:
            self._metadata = (time.monotonic(), found)
        return found

    def authorization_url(self, *, flow: Flow, redirect_uri: str, scopes: Iterable[str]) -> str:
        """Where to send the browser: the authorization endpoint with this sign-in's state, nonce
        and PKCE challenge (S256)."""
        endpoint = self.metadata().authorization_endpoint
        query = urlencode({"response_type": "code", "client_id": self.client_id, "redirect_uri": redirect_uri,
                           "scope": " ".join(scopes), "state": flow.state, "nonce": flow.nonce,
                           "code_challenge": flow.challenge, "code_challenge_method": "S256"})
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"

    def redeem(self, *, code: str, flow: Flow, redirect_uri: str) -> tuple[str, str | None]:
        """The ID token and access token the provider gives for ``code``.

        Raises:
            ProviderUnavailable: the token endpoint does not answer, refuses (its ``error`` is
                said, never the code), or answers without an ID token.
        """
        meta = self.metadata()
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "code_verifier": flow.verifier}
        headers = {"Accept": "application/json"}
        if self._secret is not None and meta.basic_auth:  # RFC 6749 2.3.1: each part form-encoded first
            auth = httpx.BasicAuth(quote(self.client_id, safe=""), quote(self._secret, safe=""))
            answer = self._request("POST", meta.token_endpoint, data=form, headers=headers, auth=auth)
        else:
            form["client_id"] = self.client_id
            if self._secret is not None:
                form["client_secret"] = self._secret
            answer = self._request("POST", meta.token_endpoint, data=form, headers=headers)
        document = self._json(answer, "token endpoint's answer")
        if answer.status_code != 200:
            error = str(document.get("error", ""))[:60]
            raise ProviderUnavailable(f"the identity provider's token endpoint refused the sign-in "
                                      f"(HTTP {answer.status_code}{', ' + error if error else ''})")
        id_token, access_token = document.get("id_token"), document.get("access_token")
        if not isinstance(id_token, str):
            raise ProviderUnavailable("the identity provider's token endpoint gave no ID token")
        return id_token, access_token if isinstance(access_token, str) else None

    def id_token_claims(self, id_token: str, *, nonce: str) -> dict[str, Any]:
        """The claims of ``id_token`` once it passes :func:`verify_id_token` under the provider's keys.

        Raises:
            IdTokenRefused: it fails a check, or is signed with a key the provider does not publish.
            ProviderUnavailable: the provider's keys cannot be read.
        """
        meta = self.metadata()
        with self._lock:
            if self._keys is None or self._keys[0] != meta.jwks_uri:
                self._keys = (meta.jwks_uri, self._jwks_client(meta.jwks_uri))
            keys = self._keys[1]
        try:
            with self._place():
                key = keys.get_signing_key_from_jwt(id_token)
        except jwt.PyJWKClientConnectionError as exc:
            raise ProviderUnavailable(f"the identity provider's keys cannot be read at {meta.jwks_uri}") from exc
        except (jwt.PyJWKClientError, jwt.PyJWTError) as exc:
            raise IdTokenRefused("the identity provider's ID token is signed with a key it does not publish") from exc
        return verify_id_token(id_token, key=key, issuer=self.issuer, client_id=self.client_id, nonce=nonce,
                               algorithms=meta.algorithms)

    def userinfo(self, access_token: str, *, subject: str) -> dict[str, Any]:
        """The userinfo endpoint's claims (empty if the provider has none, or answers other than
        JSON).

        Raises:
            ProviderUnavailable: it does not answer, refuses, or names another subject.
        """
        endpoint = self.metadata().userinfo_endpoint
        if endpoint is None:
            return {}
        answer = self._request("GET", endpoint, headers={"Authorization": f"Bearer {access_token}",
                                                         "Accept": "application/json"})
        if answer.status_code != 200:
            raise ProviderUnavailable(f"the identity provider's userinfo endpoint answered HTTP {answer.status_code}")
        if not answer.headers.get("content-type", "").startswith("application/json"):
            return {}  # a signed or encrypted userinfo (application/jwt): the ID token's claims alone
        claims = self._json(answer, "userinfo")
        if claims.get("sub") != subject:
            raise ProviderUnavailable("the identity provider's userinfo names another subject than its ID token")
        return claims

    def end_session_url(self, *, post_logout_redirect_uri: str) -> str | None:
        """Where to send the browser to sign out at the provider too (None: it has no
        ``end_session_endpoint``, or cannot be asked now)."""
        try:
            endpoint = self.metadata().end_session_endpoint
        except ProviderUnavailable:
            return None
        if endpoint is None:
            return None
        query = urlencode({"client_id": self.client_id, "post_logout_redirect_uri": post_logout_redirect_uri})
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"
