"""Single sign-on on the phone's page instead of an invitation (``/ui/join/sign-in``), in-process
with a fake provider (the console's own sign-in flow: tests/unit/services/test_console_oidc.py):
a person the mapping gives ``agent:enroll-device`` gets a one-time invitation for their own user
id and platform, made by ``oidc:<name>``, and the page moves on to the join page with it; anyone
else is refused with a page that says so and nothing is made. The flow's protections hold: posts
from another origin, a replayed answer, and a console sign-in's cookie are refused. Against the
suite's real OpenID provider, in a browser: ``tests/ui/browser/test_join_sign_in.py``."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.adapters.agent.crypto import KeyPair
from app.domain.oidc import Flow, mapping_fingerprint, parse_mapping
from app.main import create_app
from app.services.console_oidc import OidcSignIn
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import agent_server_config, register_keys

pytestmark = pytest.mark.anyio
BASE = "http://qoss.test"
REDIRECT = f"{BASE}/ui/oidc/callback"
ORIGIN = {"Origin": BASE}
MAPPING = '{"groups": {"phones": ["agent:enroll-device"], "ops": ["ratings:write"]}}'
BINDING = "j" * 43


class _Provider:
    """Gives back the claims of whoever is about to sign in, for the code it was shown."""

    issuer = "https://idp.example.test/"

    def __init__(self) -> None:
        self.claims: dict[str, Any] = {}
        self.flow: Flow | None = None
        self.redeemed = 0

    def authorization_url(self, *, flow: Flow, redirect_uri: str, scopes: Any) -> str:
        self.flow = flow
        return f"https://idp.example.test/auth?state={flow.state}"

    def redeem(self, *, code: str, flow: Flow, redirect_uri: str) -> tuple[str, str | None]:
        self.redeemed += 1
        assert (code, redirect_uri) == ("code-1", REDIRECT)
        return "id-token", None

    def id_token_claims(self, id_token: str, *, nonce: str) -> dict[str, Any]:
        return {"sub": f"u-{self.claims.get('preferred_username')}", "exp": int(time.time()) + 3600, **self.claims}

    def userinfo(self, access_token: str, *, subject: str) -> dict[str, Any]:
        return {}

    def end_session_url(self, *, post_logout_redirect_uri: str) -> str | None:
        return None


@pytest.fixture
async def phone(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Any, _Provider]]:
    config, _ = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))
    provider = _Provider()
    mapping = parse_mapping(MAPPING)
    async with app.router.lifespan_context(app):
        app.state.runtime.oidc = OidcSignIn(
            provider=provider, name="Example ID", mapping=mapping, request_scopes=("openid",),
            fingerprint=mapping_fingerprint(issuer=provider.issuer, client_id="qoss", mapping=mapping),
            max_ttl=timedelta(hours=8), session_ttl=None, redirect_url=REDIRECT)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
            yield client, app, provider


async def sign_in(client: httpx.AsyncClient, provider: _Provider, claims: dict[str, Any], *,
                  platform: str = "android") -> httpx.Response:
    """The phone's sign-in as its browser makes it: the start, the provider, the callback page's post."""
    provider.claims = claims
    started = await client.post("/ui/join/oidc/start", data={"binding": BINDING}, headers=ORIGIN)
    assert started.status_code == 200, started.text
    assert provider.flow is not None
    assert provider.flow.state in started.text  # on to the provider
    return await client.post("/ui/join/oidc/callback", headers=ORIGIN, data={
        "state": provider.flow.state, "code": "code-1", "error": "", "binding": BINDING, "platform": platform})


def invitations(app: Any) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = app.state.runtime.agent_host.invitations.list()
    return listed


async def test_a_person_in_the_enrolling_group_gets_an_invitation_for_their_own_user_id(
        phone: tuple[httpx.AsyncClient, Any, _Provider], settings: Settings) -> None:
    client, app, provider = phone
    page = await client.get("/ui/join/sign-in")
    assert page.status_code == 200
    assert "Sign in with Example ID" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    done = await sign_in(client, provider, {"preferred_username": "Dana", "groups": ["phones"],
                                            "email": "dana@example.test", "email_verified": True},
                         platform="apple")
    assert done.status_code == 200, done.text
    found = re.search(r'url=/ui/join#i=([A-Za-z0-9_-]{20,})"', done.text)
    assert found is not None, done.text
    assert done.headers["cache-control"] == "no-store"
    (made,) = invitations(app)
    assert (made["user_id"], made["platform"], made["created_by"], made["state"]) == (
        "dana", "apple", "oidc:dana@example.test", "waiting")
    assert made["objectives"] == [3]
    admin = make_token(settings.database_url, "auditor", ["audit:read"])
    audit = (await client.get("/v1/audit", headers={"Authorization": f"Bearer {admin}"})).json()
    (entry,) = [e for e in audit if e["object"] == "/ui/join/oidc/callback"]
    assert entry["token_name"] == "oidc:dana@example.test", entry
    assert entry["detail"] == f"phone sign-in: device enrolment for user=dana platform=apple invitation={made['id']}"
    assert found.group(1) not in str(audit)  # the invitation's secret is written nowhere
    # The same answer again: refused before the provider is asked, nothing more made.
    again = await client.post("/ui/join/oidc/callback", headers=ORIGIN, data={
        "state": provider.flow.state if provider.flow else "", "code": "code-1", "binding": BINDING,
        "platform": "apple"})
    assert again.status_code == 401
    assert provider.redeemed == 1
    assert len(invitations(app)) == 1


@pytest.mark.parametrize("groups", [["ops"], []], ids=["another-scope", "no-scope"])
async def test_a_person_outside_the_enrolling_group_is_refused_with_a_page_that_says_so(
        phone: tuple[httpx.AsyncClient, Any, _Provider], groups: list[str]) -> None:
    client, app, provider = phone
    done = await sign_in(client, provider, {"preferred_username": "eve", "groups": groups})
    assert done.status_code == 403
    assert "not allowed to enrol devices" in done.text
    assert "You signed in as eve" in done.text
    assert "/ui/join#i=" not in done.text
    assert invitations(app) == []


async def test_a_user_enrolled_with_keys_of_their_own_is_not_invited_under_that_id(
        phone: tuple[httpx.AsyncClient, Any, _Provider]) -> None:
    client, app, provider = phone
    keys = KeyPair.generate("frank")
    register_keys(keys)
    app.state.runtime.agent_host.enroll(user_id="frank", objectives=[3], **keys.public.as_dict())
    done = await sign_in(client, provider, {"preferred_username": "frank", "groups": ["phones"]})
    assert done.status_code == 409
    assert "enrolled with keys of its own" in done.text
    assert invitations(app) == []


async def test_posts_from_another_origin_and_a_console_sign_ins_cookie_are_refused(
        phone: tuple[httpx.AsyncClient, Any, _Provider]) -> None:
    client, app, provider = phone
    elsewhere = await client.post("/ui/join/oidc/start", data={"binding": BINDING},
                                  headers={"Origin": "https://evil.example"})
    assert elsewhere.status_code == 403
    assert provider.flow is None
    # A console sign-in's flow cookie, planted under the phone sign-in's name, opens nothing.
    console = await client.post("/ui/oidc/start", data={"binding": BINDING}, headers=ORIGIN)
    assert console.status_code == 200
    assert provider.flow is not None
    client.cookies.set("qoss_join_oidc", client.cookies["qoss_oidc"], path="/ui/join/oidc")
    provider.claims = {"preferred_username": "mallory", "groups": ["phones"]}
    done = await client.post("/ui/join/oidc/callback", headers=ORIGIN, data={
        "state": provider.flow.state, "code": "code-1", "binding": BINDING, "platform": "android"})
    assert done.status_code == 401
    assert provider.redeemed == 0
    assert invitations(app) == []


async def test_without_a_provider_the_page_points_to_an_invitation(settings: Settings, tmp_path: Path) -> None:
    config, _ = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
        page = await client.get("/ui/join/sign-in")
    assert page.status_code == 404
    assert "Ask your administrator for an invitation link" in page.text


async def test_my_devices_offers_the_sign_in_where_a_provider_is_configured(
        phone: tuple[httpx.AsyncClient, Any, _Provider]) -> None:
    client, _, _ = phone
    page = await client.get("/ui/my-devices")
    assert page.status_code == 200
    assert '<a href="/ui/join/sign-in">sign in with Example ID</a>' in page.text
