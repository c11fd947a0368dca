"""The console's OpenID client against keys made here and a fake provider that speaks the
protocol over httpx's MockTransport: an ID token is taken only with a good signature, its
issuer, this client as audience, not expired, and this sign-in's nonce."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from app.adapters.oidc import OidcProvider, verify_id_token
from app.domain.oidc import Flow, IdTokenRefused, ProviderUnavailable

ISSUER = "https://idp.example.test/realms/ops"
CLIENT = "qoss-console"
NONCE = "n-0S6_WzA2Mj"
_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
_OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {"iss": ISSUER, "aud": CLIENT, "sub": "248289761001", "iat": now, "exp": now + 300,
                              "nonce": NONCE, "groups": ["qoss-admins"]}
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _token(key: Any = _KEY, algorithm: str = "RS256", kid: str = "k1", **changes: Any) -> str:
    return jwt.encode(_claims(**changes), key, algorithm=algorithm, headers={"kid": kid})


def _verify(token: str, **overrides: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {"key": _KEY.public_key(), "issuer": ISSUER, "client_id": CLIENT, "nonce": NONCE,
                                 "algorithms": ["RS256"]}
    arguments.update(overrides)
    return verify_id_token(token, **arguments)


def test_a_good_id_token_gives_its_claims() -> None:
    claims = _verify(_token())
    assert (claims["sub"], claims["groups"]) == ("248289761001", ["qoss-admins"])


def test_a_token_signed_by_another_key_is_refused() -> None:
    with pytest.raises(IdTokenRefused, match="bad signature"):
        _verify(_token(key=_OTHER_KEY))


def test_a_token_for_another_client_is_refused() -> None:
    with pytest.raises(IdTokenRefused, match="aud"):
        _verify(_token(aud="another-client"))


def test_a_token_for_several_clients_needs_this_one_as_authorised_party() -> None:
    with pytest.raises(IdTokenRefused, match="several clients"):
        _verify(_token(aud=[CLIENT, "another-client"]))
    assert _verify(_token(aud=[CLIENT, "another-client"], azp=CLIENT))["azp"] == CLIENT


def test_an_expired_token_is_refused() -> None:
    past = int(time.time()) - 3600
    with pytest.raises(IdTokenRefused, match="expired"):
        _verify(_token(iat=past - 300, exp=past))


def test_a_token_of_another_sign_in_is_refused() -> None:
    with pytest.raises(IdTokenRefused, match="nonce"):
        _verify(_token(nonce="someone-elses-nonce"))
    with pytest.raises(IdTokenRefused, match="nonce"):
        _verify(_token(nonce=None))


def test_a_token_from_another_issuer_is_refused() -> None:
    with pytest.raises(IdTokenRefused, match="iss"):
        _verify(_token(iss="https://evil.example.test/"))


def test_a_token_without_expiry_is_refused() -> None:
    with pytest.raises(IdTokenRefused, match="MissingRequiredClaim"):
        _verify(_token(exp=None))


def test_an_unsigned_or_hmac_token_is_refused_whatever_the_key() -> None:
    unsigned = jwt.encode(_claims(), None, algorithm="none")
    with pytest.raises(IdTokenRefused):
        _verify(unsigned, algorithms=["RS256", "none"])
    shared = jwt.encode(_claims(), "the-client-secret-is-not-a-signing-key-x", algorithm="HS256")
    with pytest.raises(IdTokenRefused):
        _verify(shared, key="the-client-secret-is-not-a-signing-key-x", algorithms=["HS256", "RS256"])


def test_an_ec_signed_token_is_taken_when_the_provider_says_es256() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    assert _verify(_token(key=key, algorithm="ES256"), key=key.public_key(), algorithms=["ES256"])["sub"]


# The provider, over a fake that speaks OpenID Connect.

def _jwks(*keys: tuple[str, Any]) -> dict[str, Any]:
    found = []
    for kid, key in keys:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        found.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
    return {"keys": found}


class _FakeKeys:
    """What PyJWKClient does, over the JWKS the fake provider serves (no urllib)."""

    def __init__(self, http: httpx.Client, uri: str) -> None:
        self.http, self.uri = http, uri

    def get_signing_key_from_jwt(self, token: str) -> jwt.PyJWK:
        kid = jwt.get_unverified_header(token).get("kid")
        for key in jwt.PyJWKSet.from_dict(self.http.get(self.uri).json()).keys:
            if key.key_id == kid:
                return key
        raise jwt.PyJWKClientError(f"no key {kid}")


class _FakeProvider:
    """Discovery, JWKS, token and userinfo endpoints; checks the client's secret and PKCE."""

    def __init__(self, *, issuer: str = ISSUER, id_token: str | None = None) -> None:
        self.issuer = issuer
        self.id_token = id_token
        self.challenges: dict[str, str] = {}
        self.token_requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/.well-known/openid-configuration"):
            base = ISSUER
            return httpx.Response(200, json={
                "issuer": self.issuer, "authorization_endpoint": f"{base}/auth", "token_endpoint": f"{base}/token",
                "jwks_uri": f"{base}/keys", "userinfo_endpoint": f"{base}/userinfo",
                "end_session_endpoint": f"{base}/logout", "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"]})
        if path.endswith("/keys"):
            return httpx.Response(200, json=_jwks(("k1", _KEY)))
        if path.endswith("/token"):
            self.token_requests.append(request)
            form = parse_qs(request.content.decode())
            expected = "Basic " + base64.b64encode(f"{CLIENT}:s%3Acret".encode()).decode()
            if request.headers.get("authorization") != expected:
                return httpx.Response(401, json={"error": "invalid_client"})
            verifier = form["code_verifier"][0]
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
            if self.challenges.get(form["code"][0]) != challenge:
                return httpx.Response(400, json={"error": "invalid_grant"})
            return httpx.Response(200, json={"id_token": self.id_token, "access_token": "at-1", "token_type": "Bearer"})
        if path.endswith("/userinfo"):
            assert request.headers["authorization"] == "Bearer at-1"
            return httpx.Response(200, json={"sub": "248289761001", "email": "alice@example.test",
                                             "email_verified": True})
        return httpx.Response(404)


def _provider(fake: _FakeProvider) -> OidcProvider:
    http = httpx.Client(transport=httpx.MockTransport(fake.handle))
    return OidcProvider(issuer=ISSUER, client_id=CLIENT, client_secret="s:cret", http=http,
                        jwks_client=lambda uri: _FakeKeys(http, uri))  # type: ignore[arg-type,return-value]


def test_a_code_is_redeemed_with_the_secret_and_the_pkce_verifier_and_its_id_token_checked() -> None:
    flow = Flow.of(b"k" * 32, "flow-1")
    fake = _FakeProvider(id_token=_token(nonce=flow.nonce))
    provider = _provider(fake)
    url = provider.authorization_url(flow=flow, redirect_uri="https://qoss.example.test/ui/oidc/callback",
                                     scopes=["openid", "email"])
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert url.startswith(f"{ISSUER}/auth?")
    assert query["code_challenge_method"] == "S256" and query["state"] == flow.state  # noqa: PT018
    assert query["nonce"] == flow.nonce and flow.verifier not in url  # noqa: PT018
    fake.challenges["code-1"] = query["code_challenge"]
    id_token, access = provider.redeem(code="code-1", flow=flow,
                                       redirect_uri="https://qoss.example.test/ui/oidc/callback")
    claims = provider.id_token_claims(id_token, nonce=flow.nonce)
    assert claims["sub"] == "248289761001"
    assert provider.userinfo(access or "", subject=claims["sub"])["email"] == "alice@example.test"
    assert "s:cret" not in repr(provider)


def test_a_code_redeemed_without_its_verifier_is_refused_by_the_provider() -> None:
    flow = Flow.of(b"k" * 32, "flow-1")
    fake = _FakeProvider(id_token=_token(nonce=flow.nonce))
    fake.challenges["code-1"] = Flow.of(b"k" * 32, "another-flow").challenge
    with pytest.raises(ProviderUnavailable, match="invalid_grant") as refused:
        _provider(fake).redeem(code="code-1", flow=flow, redirect_uri="https://qoss.example.test/ui/oidc/callback")
    assert "code-1" not in str(refused.value)


def test_a_token_signed_with_a_key_the_provider_does_not_publish_is_refused() -> None:
    flow = Flow.of(b"k" * 32, "flow-1")
    provider = _provider(_FakeProvider())
    with pytest.raises(IdTokenRefused, match="does not publish"):
        provider.id_token_claims(_token(key=_OTHER_KEY, kid="k2", nonce=flow.nonce), nonce=flow.nonce)
    with pytest.raises(IdTokenRefused, match="bad signature"):
        provider.id_token_claims(_token(key=_OTHER_KEY, kid="k1", nonce=flow.nonce), nonce=flow.nonce)


def test_a_discovery_document_of_another_issuer_is_refused() -> None:
    with pytest.raises(ProviderUnavailable, match="names issuer"):
        _provider(_FakeProvider(issuer="https://idp.example.test/realms/other")).metadata()


def test_an_unreachable_provider_is_said_plainly() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    provider = OidcProvider(issuer=ISSUER, client_id=CLIENT, client_secret="s",
                            http=httpx.Client(transport=httpx.MockTransport(down)))
    with pytest.raises(ProviderUnavailable, match="does not answer") as refused:
        provider.metadata()
    assert isinstance(refused.value.__cause__, httpx.ConnectError)
    assert provider.end_session_url(post_logout_redirect_uri="https://q/ui/login") is None


def test_sign_out_at_the_provider_names_this_client_and_where_to_come_back() -> None:
    url = _provider(_FakeProvider()).end_session_url(post_logout_redirect_uri="https://qoss.example.test/ui/login")
    assert url is not None
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert url.startswith(f"{ISSUER}/logout?")
    assert query == {"client_id": CLIENT, "post_logout_redirect_uri": "https://qoss.example.test/ui/login"}


def test_requests_to_a_provider_that_hangs_are_bounded_in_number_and_the_next_is_refused_at_once() -> None:
    entered, release = threading.Semaphore(0), threading.Event()

    def hangs(request: httpx.Request) -> httpx.Response:
        entered.release()
        release.wait(timeout=30)
        raise httpx.ReadTimeout("no answer", request=request)

    provider = OidcProvider(issuer=ISSUER, client_id=CLIENT, client_secret="s", in_flight=2,
                            http=httpx.Client(transport=httpx.MockTransport(hangs)))
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(provider.metadata) for _ in range(2)]
        try:
            for _ in range(2):
                assert entered.acquire(timeout=30)
            with pytest.raises(ProviderUnavailable, match="too many sign-ins are waiting"):
                provider.metadata()
        finally:
            release.set()
        for future in waiting:
            with pytest.raises(ProviderUnavailable, match="does not answer"):
                future.result(timeout=30)
    with pytest.raises(ProviderUnavailable, match="does not answer"):  # the places are free again
        provider.metadata()
