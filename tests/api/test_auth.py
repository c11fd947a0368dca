"""Authentication and scopes: every protected endpoint x every kind of bad credential.

In the spirit of headscale's integration/api_auth_test.go: no header, malformed,
invalid, expired, revoked, wrong scope -> 401 / 403 with a tiny body, nothing leaked,
nothing changed.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import MetaData, select

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.models import AuditChainHeadRow, AuditRow, EventRow, RateBucketRow
from app.adapters.db.repositories import TokenRepository
from app.api.routes import admin, agent, algorithms, benchmarks, gateways, negotiations, policies, ratings, tunnels
from app.domain.auth import TokenRecord, hash_secret
from app.main import create_app
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import agent_server_config
from tests.fixtures.figures import tally
from tests.fixtures.secrets import register

pytestmark = pytest.mark.anyio


ROUTE_MODULES = (admin, agent, algorithms, benchmarks, gateways, negotiations, policies, ratings, tunnels)


def all_routes() -> list[APIRoute]:
    return [r for module in ROUTE_MODULES for r in module.router.routes if isinstance(r, APIRoute)]


def route_scopes(route: APIRoute) -> list[str]:
    """The scopes a route's ``require(...)`` dependencies ask for."""
    return [
        cell.cell_contents
        for dep in route.dependant.dependencies
        if getattr(dep.call, "__qualname__", "").startswith("require.")
        for cell in (getattr(dep.call, "__closure__", None) or ())
        if isinstance(cell.cell_contents, str)
    ]


def protected_routes() -> list[tuple[str, str, str]]:
    """(method, path with dummy parameters, scope) of every route that needs a scope."""
    out = []
    for route in all_routes():
        scopes = route_scopes(route)
        if not scopes:
            continue
        path = re.sub(r"\{token_id\}", "0123456789ab", "/v1" + route.path)
        path = re.sub(r"\{[a-z_]+\}", "x", path)
        for method in sorted(route.methods):
            out.append((method, path, scopes[0]))
    return out


ROUTES = protected_routes()


def test_every_write_route_is_protected() -> None:
    methods = {(m, p) for m, p, _ in ROUTES}
    assert ("POST", "/v1/rating-tables") in methods
    assert ("PATCH", "/v1/rating-tables/x/ratings/x") in methods
    assert ("POST", "/v1/tunnels") in methods
    assert ("DELETE", "/v1/tunnels/x") in methods
    assert ("POST", "/v1/tokens") in methods
    assert {("POST", "/v1/agent/users"), ("GET", "/v1/agent/users"), ("DELETE", "/v1/agent/users/x"),
            ("GET", "/v1/agent/sessions"), ("GET", "/v1/agent/revocations")} <= methods
    assert len(ROUTES) >= 20


def test_every_route_is_either_protected_or_a_known_open_one() -> None:
    """A new route cannot slip out of the matrix: it needs a scope or a place on this list."""
    open_routes = {(method, "/v1" + route.path) for route in all_routes() if not route_scopes(route)
                   for method in route.methods}
    assert {m for m, _ in open_routes} <= {"GET", "POST"}
    posts = sorted(p for m, p in open_routes if m == "POST")
    # negotiations compute without changing state; the agent messages (a device profile's handoff
    # included) are signed and sealed; a handed-off profile is fetched with the link's secret, and an
    # invitation is redeemed with its secret, signed by the keys it registers.
    assert posts == ["/v1/agent/handoffs", "/v1/agent/invitations/redeem", "/v1/agent/requests",
                     "/v1/agent/target/requests", "/v1/agent/target/revocations", "/v1/negotiations"]
    assert ("GET", "/v1/agent/handoffs/{token}") in open_routes


def snapshot(database_url: str) -> dict[str, list[str]]:
    """Every row of every table but the audit log, its chain head and the events (which record the
    refusals: each audit entry is an event too), and the rate limits' buckets (which count them)."""
    engine = make_engine(database_url)
    meta = MetaData()
    try:
        meta.reflect(engine)
        with engine.connect() as conn:
            return {table.name: sorted(repr(tuple(row)) for row in conn.execute(select(table)))
                    for table in meta.sorted_tables
                    if table.name not in (AuditRow.__tablename__, AuditChainHeadRow.__tablename__,
                                          EventRow.__tablename__, RateBucketRow.__tablename__)}
    finally:
        engine.dispose()


def insert_token(database_url: str, *, expired: bool = False, revoked: bool = False) -> str:
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    register(secret)
    now = datetime.now(UTC)
    record = TokenRecord(token_id, "old", frozenset({"admin"}), hash_secret(secret), now - timedelta(days=2),
                         now - timedelta(days=1) if expired else now + timedelta(days=1), None)
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s, s.begin():
            TokenRepository(s).add(record, created_by="tests")
            if revoked:
                TokenRepository(s).revoke(token_id)
    finally:
        engine.dispose()
    return f"qoss_{token_id}_{secret}"


@pytest.fixture
async def bare(settings: Settings, tmp_path: Path) -> Any:
    """No credentials; the app plays the agent's Host and Target roles, so agent routes are live.
    Its failed token checks are not held back (test_refusal_flood.py tests that)."""
    app = create_app(settings.model_copy(update={"agent_config": agent_server_config(tmp_path)[0],
                                                 "auth_failure_burst": 100_000}))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://q.test") as c:
        yield c


async def test_auth_matrix(bare: httpx.AsyncClient, settings: Settings, admin_token: str) -> None:
    url = settings.database_url
    valid_id = admin_token.split("_", 2)[1]
    wrong_scope = make_token(url, "reader-only", ["audit:read"])
    credentials: dict[str, dict[str, str]] = {
        "no header": {},
        "malformed": {"Authorization": "Bearer not-a-token"},
        "not bearer": {"Authorization": f"Basic {admin_token}"},
        "invalid secret": {"Authorization": f"Bearer qoss_{valid_id}_{'A' * 43}"},
        "unknown id": {"Authorization": f"Bearer qoss_ffffffffffff_{'A' * 43}"},
        "expired": {"Authorization": f"Bearer {insert_token(url, expired=True)}"},
        "revoked": {"Authorization": f"Bearer {insert_token(url, revoked=True)}"},
    }
    before = snapshot(url)
    checked = 0
    for method, path, scope in ROUTES:
        for label, headers in credentials.items():
            r = await bare.request(method, path, headers=headers, json={})
            assert r.status_code == 401, (method, path, label, r.text)
            assert r.json() == {"error": "Unauthenticated", "detail": "a valid API token is required"}
            assert r.headers["www-authenticate"] == "Bearer"
            checked += 1
        if scope != "audit:read":
            r = await bare.request(method, path, headers={"Authorization": f"Bearer {wrong_scope}"}, json={})
            assert r.status_code == 403, (method, path, r.text)
            assert r.json()["error"] == "Forbidden"
            assert len(r.content) < 200
            checked += 1
    assert checked >= 150
    assert snapshot(url) == before
    tally(f"auth matrix requests ({len(ROUTES)} protected routes x {len(credentials)} bad credentials -> 401, "
          "x wrong scope -> 403; 0 state changes), summed over backends", checked)


async def test_secrets_never_appear_in_token_listing_or_audit(client: httpx.AsyncClient, admin_token: str) -> None:
    created = await client.post("/v1/tokens", json={"name": "ci", "scopes": ["tunnels:read"]})
    assert created.status_code == 201
    secret = created.json()["token"]
    register(secret)
    listed = await client.get("/v1/tokens")
    audit = await client.get("/v1/audit", params={"limit": 1000})
    for text in (listed.text, audit.text):
        assert secret not in text
        assert admin_token not in text
        assert admin_token.split("_", 2)[2] not in text


async def test_revoked_token_is_refused_at_once(client: httpx.AsyncClient) -> None:
    created = (await client.post("/v1/tokens", json={"name": "tmp", "scopes": ["ratings:write"]})).json()
    register(created["token"])
    headers = {"Authorization": f"Bearer {created['token']}"}
    ok = await client.post("/v1/rating-tables", headers=headers, json={
        "name": "by-tmp", "ratings": [{"algorithm": "aes128", "confidentiality": 8, "performance": 8}]})
    assert ok.status_code == 201
    assert (await client.delete(f"/v1/tokens/{created['id']}")).status_code == 204
    refused = await client.delete("/v1/rating-tables/by-tmp", headers=headers)
    assert refused.status_code == 401


async def test_unknown_scope_is_422(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/tokens", json={"name": "x", "scopes": ["root"]})
    assert r.status_code == 422


async def test_reads_are_open_by_default_and_closed_when_configured(settings: Settings) -> None:
    for required, expected in ((False, 200), (True, 401)):
        app = create_app(settings.model_copy(update={"reads_require_token": required}))
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test"
        ) as c:
            assert (await c.get("/v1/rating-tables")).status_code == expected
            assert (await c.post("/v1/negotiations", json={"peers": [{"name": "a"}]})).status_code == expected


async def test_every_change_and_refusal_is_audited(client: httpx.AsyncClient, settings: Settings) -> None:
    await client.post("/v1/policies", json={"name": "audited", "min_levels": {"integrity": 3}},
                      headers={"X-Request-ID": "req-123"})
    async with httpx.AsyncClient(transport=client._transport, base_url="http://qoss.test") as anonymous:
        await anonymous.delete("/v1/policies/audited")
    records = (await client.get("/v1/audit")).json()
    created = next(r for r in records if r["client_request_id"] == "req-123")
    assert created["action"] == "POST"
    assert created["object"] == "/v1/policies"
    assert created["outcome"] == 201
    assert created["token_name"] == "test-admin"
    refused = next(r for r in records if r["object"] == "/v1/policies/audited" and r["action"] == "DELETE")
    assert refused["outcome"] == 401
    assert refused["detail"] == "Unauthenticated"
    assert refused["token_id"] is None


async def test_tunnel_creation_is_rate_limited_per_token(settings: Settings, admin_token: str) -> None:
    app = create_app(settings.model_copy(update={"tunnel_burst": 2, "tunnel_rate": 0.01}))
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://q.test", headers=headers
    ) as c:
        body = {"initiator": "nowhere", "responder": "elsewhere"}
        assert [(await c.post("/v1/tunnels", json=body)).status_code for _ in range(2)] == [404, 404]
        limited = await c.post("/v1/tunnels", json=body)
        assert limited.status_code == 429
        assert int(limited.headers["retry-after"]) >= 1
        other = make_token(settings.database_url, "other", ["tunnels:write"])
        assert (await c.post("/v1/tunnels", json=body, headers={"Authorization": f"Bearer {other}"})).status_code == 404


async def test_gateway_outside_allowed_networks_is_422(client: httpx.AsyncClient, tmp_path: Any) -> None:
    r = await client.post("/v1/gateways", json={"name": "far", "vici_socket": "/run/far.vici",
                                                "ike_address": "8.8.8.8", "inside_networks": ["10.0.0.0/24"]})
    assert r.status_code == 422
    assert "allowed networks" in r.text
