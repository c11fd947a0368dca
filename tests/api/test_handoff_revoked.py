"""A device profile's one-time link (``/v1/agent/handoffs/<secret>``): a revoked user's links are
gone, every fetch is audited without the secret, and a flood of guessed links is held back and
counted like a flood of bad tokens."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.adapters.agent.crypto import KeyPair, seal
from app.adapters.db.agent_rows import AgentHandoffRow
from app.adapters.db.agent_store import SqlAgentStore
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.models import AuditRow, EventRow
from app.domain.agent import Handoff, Kind
from app.domain.errors import InvalidInput
from app.main import create_app
from app.services.agent.client_devices import seal_profile
from app.services.agent.host import link_id
from app.settings import Settings
from tests.api.test_agent_roles import enroll
from tests.api.test_refusal_flood import ATTACKER, counted, rows, served
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config
from tests.fixtures.handoff import open_sealed_profile

pytestmark = pytest.mark.anyio

PROFILE = b'{"uuid": "x", "name": "hq", "type": "ikev2-cert", "remote": {"addr": "10.99.0.3"}}'
SSWAN = "application/vnd.strongswan.profile"

Roles = tuple[httpx.AsyncClient, KeyPair, Settings]


@pytest.fixture
async def roles(settings: Settings, admin_token: str, tmp_path: Path) -> AsyncIterator[Roles]:
    """An app that plays Host and Target, with an administrator's API client on it: (the client,
    Host's keys, the app's settings)."""
    config, server_keys = agent_server_config(tmp_path)
    configured = settings.model_copy(update={"agent_config": config})
    app = create_app(configured)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        yield c, server_keys, configured


#: The key the tests' profiles are sealed under (a client draws one per link).
KEY = bytes(range(32))


def sealed_handoff(user: KeyPair, server: KeyPair, *, media_type: str = SSWAN, ttl: int = 600,
                   name: str = "hq.sswan") -> dict[str, str]:
    try:
        sealed = seal_profile(KEY, media_type=media_type, name=name, profile=PROFILE)
    except InvalidInput:  # a type or name a sealed line cannot carry: refused before it is read
        sealed = seal_profile(KEY, media_type=SSWAN, name="hq.sswan", profile=PROFILE)
    handoff = Handoff(user_id=user.name, host=SERVER_ID, nonce=secrets.token_bytes(16), timestamp=int(time.time()),
                      profile_name=name, media_type=media_type, profile=sealed, ttl=ttl)
    wire = seal(kind=Kind.HANDOFF, to=SERVER_ID, body=handoff.body(), signer=user, recipient=server.public.kem)
    return {"message": wire.decode("ascii")}


async def make_link(c: httpx.AsyncClient, user: KeyPair, server: KeyPair) -> str:
    r = await c.post("/v1/agent/handoffs", json=sealed_handoff(user, server))
    assert r.status_code == 200, r.text
    link: str = r.json()["message"]
    assert link.startswith("/v1/agent/handoffs/")
    return link


def waiting(database_url: str) -> int:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            return int(s.scalar(select(func.count()).select_from(AgentHandoffRow)) or 0)
    finally:
        engine.dispose()


def everything_recorded(database_url: str) -> str:
    """Every audit entry and event, as text (to look for a secret in)."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            audit = [(r.action, r.object, r.detail, r.outcome) for r in s.scalars(select(AuditRow))]
            events = [(e.kind, e.subject, e.data) for e in s.scalars(select(EventRow))]
        return repr((audit, events))
    finally:
        engine.dispose()


async def test_revoking_a_user_forgets_the_links_they_made(roles: Roles) -> None:
    c, server, settings = roles
    alice, bob = await enroll(c, "alice"), await enroll(c, "bob")
    links = [await make_link(c, alice, server) for _ in range(2)]
    kept = await make_link(c, bob, server)
    assert waiting(settings.database_url) == 3
    assert (await c.delete("/v1/agent/users/alice")).status_code == 200
    assert waiting(settings.database_url) == 1  # bob's
    for link in links:
        r = await c.get(link)
        assert (r.status_code, r.json()["error"]) == (404, "NotFound")
    assert (await c.get(kept)).status_code == 200


async def test_a_link_left_behind_by_a_revoked_user_is_refused_and_spent(roles: Roles) -> None:
    """One made after the revocation had forgotten the user's (another replica's, say)."""
    c, _, settings = roles
    await enroll(c, "carol")
    assert (await c.delete("/v1/agent/users/carol")).status_code == 200
    token = secrets.token_urlsafe(32)
    engine = make_engine(settings.database_url)
    try:
        with SqlAgentStore(make_session_factory(engine)).unit() as uow:
            uow.handoffs.add(digest=hashlib.sha256(token.encode()).hexdigest(), user_id="carol",
                             profile_name="hq.sswan", media_type=SSWAN, profile=PROFILE,
                             expires_at=datetime.now(UTC) + timedelta(minutes=10))
            uow.commit()
    finally:
        engine.dispose()
    r = await c.get(f"/v1/agent/handoffs/{token}")
    assert (r.status_code, r.json()["error"]) == (404, "NotFound")
    assert PROFILE not in r.content
    assert waiting(settings.database_url) == 0


async def test_every_fetch_is_audited_without_the_links_secret(roles: Roles) -> None:
    c, server, settings = roles
    dave = await enroll(c, "dave")
    link = await make_link(c, dave, server)
    token = link.rsplit("/", 1)[1]
    got = await c.get(link, headers={"X-Request-ID": "fetch-1"})
    assert got.status_code == 200
    assert open_sealed_profile(KEY, got.content) == PROFILE
    again = await c.get(link, headers={"X-Request-ID": "fetch-2"})
    assert again.status_code == 404
    listed = (await c.get("/v1/audit", params={"limit": 1000})).json()
    entries = {r["client_request_id"]: r for r in listed if r["client_request_id"]}
    first, second = entries["fetch-1"], entries["fetch-2"]
    assert (first["action"], first["object"], first["outcome"]) == ("GET", "/v1/agent/handoffs/REDACTED", 200)
    assert first["detail"] == f"handoff fetched: user=dave profile=hq.sswan link={link_id(token)}"
    assert (second["object"], second["outcome"], second["detail"]) == ("/v1/agent/handoffs/REDACTED", 404,
                                                                       "NotFound")
    made = next(r for r in listed if r["action"] == "POST" and r["object"] == "/v1/agent/handoffs")
    assert made["detail"].endswith(f"link={link_id(token)}")  # the link's making and its fetch, matched
    assert token not in everything_recorded(settings.database_url)


async def test_a_profile_is_served_as_a_download_never_as_a_page(roles: Roles) -> None:
    c, server, _ = roles
    erin = await enroll(c, "erin")
    r = await c.get(await make_link(c, erin, server))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"  # sealed: only the link's page opens it
    assert r.headers["content-disposition"] == 'attachment; filename="hq.sswan.sealed"'
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-security-policy"] == "default-src 'none'; sandbox"
    assert r.headers["cache-control"] == "no-store"


async def test_300_guessed_links_from_one_address_are_held_back_and_counted(
        settings: Settings, tmp_path: Path) -> None:
    config, _ = agent_server_config(tmp_path)
    burst = settings.auth_failure_burst
    slow = {"agent_config": config, "auth_failure_rate": 0.001}  # no refill within the test
    async with served(settings.model_copy(update=slow)) as client:
        attacker, other = client(ATTACKER), client("198.51.100.9")
        guesses = [secrets.token_urlsafe(32) for _ in range(300)] + ["short", "x" * 300, "%2e%2e"]
        answers: list[Any] = [await attacker.get(f"/v1/agent/handoffs/{g}") for g in guesses]
        statuses = [a.status_code for a in answers]
        assert statuses[:burst] == [404] * burst
        assert set(statuses[burst:]) == {429}
        assert answers[-1].json()["detail"] == "rate limit exceeded for failed authentications from this address"
        assert (await other.get(f"/v1/agent/handoffs/{guesses[0]}")).status_code == 404  # not held back
    entries, _, intact = rows(settings.database_url)
    assert len(entries) <= 4, entries
    assert counted(entries, 404) == burst
    assert counted(entries, 429) == len(guesses) - burst
    assert {e["object"] for e in entries} == {"/v1/agent/handoffs/REDACTED"}
    recorded = everything_recorded(settings.database_url)
    assert not any(g in recorded for g in guesses[:300])
    assert intact


@pytest.mark.parametrize(("media_type", "name"), [
    ("text/html", "hq.html"),
    ("text/html; charset=utf-8", "hq.sswan"),
    ("text/plain; charset=utf-8", "hq.conf"),
    ("application/octet-stream", "hq.sswan"),
    (SSWAN, "hq.html"),  # the type Host keeps, under a name that is not its
    ("application/x-apple-aspen-config", "hq.sswan"),
])
async def test_only_the_profiles_qoss_issues_are_kept_for_a_link(
        roles: Roles, media_type: str, name: str) -> None:
    c, server, settings = roles
    frank = await enroll(c, "frank")
    r = await c.post("/v1/agent/handoffs", json=sealed_handoff(frank, server, media_type=media_type, name=name))
    assert (r.status_code, r.json()["error"]) == (415, "UnsupportedMediaType"), r.text
    assert waiting(settings.database_url) == 0
    apple = await c.post("/v1/agent/handoffs", json=sealed_handoff(
        frank, server, media_type="application/x-apple-aspen-config", name="hq.mobileconfig"))
    assert apple.status_code == 200, apple.text


async def test_a_link_lives_ten_minutes_at_most(roles: Roles) -> None:
    c, server, settings = roles
    grace = await enroll(c, "grace")
    r = await c.post("/v1/agent/handoffs", json=sealed_handoff(grace, server, ttl=601))
    assert (r.status_code, r.json()["error"]) == (422, "InvalidInput"), r.text
    assert r.json()["detail"] == "a one-time link lives at most 600 s"
    assert waiting(settings.database_url) == 0
    assert (await c.post("/v1/agent/handoffs", json=sealed_handoff(grace, server, ttl=600))).status_code == 200


async def test_handoffs_are_limited_per_user(settings: Settings, admin_token: str, tmp_path: Path) -> None:
    config, server = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config, "agent_user_burst": 2,
                                                 "agent_user_rate": 0.001}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        heidi, ivan = await enroll(c, "heidi"), await enroll(c, "ivan")
        statuses = [(await c.post("/v1/agent/handoffs", json=sealed_handoff(heidi, server))).status_code
                    for _ in range(3)]
        assert statuses == [200, 200, 429]
        limited = await c.post("/v1/agent/handoffs", json=sealed_handoff(heidi, server))
        assert limited.json() == {"error": "RateLimited", "detail": "rate limit exceeded for this user"}
        assert (await c.post("/v1/agent/handoffs", json=sealed_handoff(ivan, server))).status_code == 200
        listed = (await c.get("/v1/audit", params={"limit": 1000})).json()
        assert any(r["outcome"] == 429 and r["detail"] == "rate limited: user=heidi" for r in listed)
    assert waiting(settings.database_url) == 3
