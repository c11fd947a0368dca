"""The audit log: one record per state change and per security decision, whoever makes it."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from typer.testing import CliRunner

from app.adapters.agent.crypto import KeyPair
from app.adapters.vici.gateway import ViciGateway
from app.cli.main import app as cli
from app.main import create_app
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.agent_roles import agent_server_config
from tests.fixtures.secrets import register

pytestmark = pytest.mark.anyio


@pytest.fixture
async def agent_client(settings: Settings, admin_token: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client of an app that plays the agent's Host and Target roles (no charon)."""
    app = create_app(settings.model_copy(update={"agent_config": agent_server_config(tmp_path)[0]}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        yield c


async def audit(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    r = await client.get("/v1/audit", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json())


async def test_every_kind_of_change_and_refusal_writes_exactly_one_record(
    agent_client: httpx.AsyncClient, settings: Settings
) -> None:
    c = agent_client
    reader = make_token(settings.database_url, "reader", ["tunnels:read"])
    user = KeyPair.generate("alice")
    rows = [{"algorithm": "aes128", "confidentiality": 8, "performance": 8}]
    sent: list[tuple[str, str, str, int, str]] = []  # request id, method, path, expected outcome, label
    client_ids: dict[str, str] = {}  # our request id -> the client's X-Request-ID

    async def call(label: str, method: str, path: str, expected: int, **kwargs: Any) -> httpx.Response:
        theirs = f"audit-{uuid.uuid4().hex[:12]}"
        headers = {"X-Request-ID": theirs, **kwargs.pop("headers", {})}
        r = await c.request(method, path, headers=headers, **kwargs)
        assert r.status_code == expected, (label, r.text)
        rid = r.headers["x-request-id"]
        assert rid != theirs
        sent.append((rid, method, path.split("?")[0], expected, label))
        client_ids[rid] = theirs
        return r

    await call("rating table created", "POST", "/v1/rating-tables", 201, json={"name": "aud", "ratings": rows})
    await call("rating row edited", "PATCH", "/v1/rating-tables/aud/ratings/aes128", 200,
               json={"confidentiality": 7}, headers={"If-Match": '"1"'})
    await call("rating edit on a stale revision", "PATCH", "/v1/rating-tables/aud/ratings/aes128", 409,
               json={"confidentiality": 6}, headers={"If-Match": '"1"'})
    await call("rating table replaced", "PUT", "/v1/rating-tables/aud", 200,
               json={"name": "aud", "ratings": rows}, headers={"If-Match": '"2"'})
    exported = (await c.get("/v1/rating-tables/aud/export")).text
    await call("rating table imported", "POST", "/v1/rating-tables/import?name=aud2", 201, content=exported,
               headers={"content-type": "text/plain"})
    await call("rating table deleted", "DELETE", "/v1/rating-tables/aud2", 204)
    await call("policy created", "POST", "/v1/policies", 201, json={"name": "aud", "min_levels": {"integrity": 3}})
    await call("policy replaced", "PUT", "/v1/policies/aud", 200, json={"name": "aud"}, headers={"If-Match": '"1"'})
    await call("policy deleted", "DELETE", "/v1/policies/aud", 204)
    await call("negotiation", "POST", "/v1/negotiations", 200, json={"peers": [{"name": "a"}]})
    await call("negotiation with nothing feasible", "POST", "/v1/negotiations", 409,
               json={"rating_table": "esaf-2006", "peers": [{"name": "a", "min_levels": {"integrity": 10}}]})
    await call("bad input", "POST", "/v1/policies", 422, json={"name": "aud", "surprise": 1})
    token = (await call("token created", "POST", "/v1/tokens", 201,
                        json={"name": "aud", "scopes": ["tunnels:read"]})).json()
    register(token["token"])
    await call("token revoked", "DELETE", f"/v1/tokens/{token['id']}", 204)
    await call("tunnel refused (unknown gateways)", "POST", "/v1/tunnels", 404,
               json={"initiator": "nowhere", "responder": "elsewhere"})
    await call("tunnel delete refused (unknown)", "DELETE", f"/v1/tunnels/{uuid.uuid4()}", 404)
    await call("agent user enrolled", "POST", "/v1/agent/users", 201,
               json={"user_id": "alice", "objectives": [3], **user.public.as_dict()})
    await call("agent request rejected", "POST", "/v1/agent/requests", 403, json={"message": "not sealed"})
    await call("agent user revoked", "DELETE", "/v1/agent/users/alice", 200)
    await call("no token", "POST", "/v1/policies", 401, json={"name": "x"}, headers={"Authorization": ""})
    await call("wrong scope", "DELETE", "/v1/policies/x", 403, headers={"Authorization": f"Bearer {reader}"})
    await call("wrong scope on a read", "GET", "/v1/audit", 403, headers={"Authorization": f"Bearer {reader}"})
    await call("body too large", "POST", "/v1/policies", 413, content=b"x" * 70_000,
               headers={"content-type": "application/json"})

    records = await audit(c)
    for rid, method, path, outcome, label in sent:
        mine = [r for r in records if r["request_id"] == rid]
        assert len(mine) == 1, (label, mine)
        (record,) = mine
        assert (record["action"], record["object"], record["outcome"]) == (method, path, outcome), label
        assert record["client_request_id"] == client_ids[rid], label
        assert record["source"], label
        if outcome in (401, 413) or label == "agent request rejected":  # no token read (agent: no token at all)
            assert record["token_id"] is None, label
        elif label.startswith("wrong scope"):
            assert (record["token_name"], record["scopes"], record["detail"]) == ("reader", ["tunnels:read"],
                                                                                 "Forbidden"), label
        else:
            assert (record["token_name"], record["scopes"]) == ("test-admin", ["admin"]), label
    details = {label: next(r["detail"] for r in records if r["request_id"] == rid) for rid, *_, label in sent}
    assert details["token created"] == f"token {token['id']} created, scopes tunnels:read"
    assert details["agent request rejected"].startswith("AgentRejected: ")
    assert details["rating edit on a stale revision"] == "EditConflict"
    assert details["negotiation with nothing feasible"] == "NoFeasibleSuite"
    assert details["bad input"] == "ValidationError"
    assert details["no token"] == "Unauthenticated"
    assert details["body too large"] == "PayloadTooLarge"


async def test_reads_that_succeed_write_no_record(client: httpx.AsyncClient) -> None:
    before = len(await audit(client))
    for path in ("/v1/rating-tables", "/v1/policies", "/v1/algorithms", "/v1/tokens"):
        assert (await client.get(path, headers={"X-Request-ID": "read-only"})).status_code == 200
    records = await audit(client)
    assert len(records) == before
    assert not [r for r in records if r["client_request_id"] == "read-only"]


async def test_the_request_id_is_ours_and_the_clients_is_kept_beside_it(client: httpx.AsyncClient) -> None:
    answers = [await client.post("/v1/policies", json={"name": name}, headers={"X-Request-ID": "same-id"})
               for name in ("prov-1", "prov-2")]
    ours = [r.headers["x-request-id"] for r in answers]
    assert [r.status_code for r in answers] == [201, 201]
    assert len(set(ours)) == 2
    assert all(len(rid) == 32 and int(rid, 16) >= 0 for rid in ours)
    records = {r["request_id"]: r for r in await audit(client)}
    assert [records[rid]["client_request_id"] for rid in ours] == ["same-id", "same-id"]
    odd = await client.post("/v1/policies", json={"name": "prov-3"}, headers={"X-Request-ID": "not a token"})
    assert odd.status_code == 201
    assert {r["request_id"]: r for r in await audit(client)}[odd.headers["x-request-id"]]["client_request_id"] is None
    plain = await client.post("/v1/policies", json={"name": "prov-4"})
    assert {r["request_id"]: r for r in await audit(client)}[plain.headers["x-request-id"]]["client_request_id"] is None


async def test_once_an_admin_token_exists_the_machine_makes_no_token_and_records_nothing(
        client: httpx.AsyncClient, settings: Settings) -> None:
    before = await audit(client)
    made = CliRunner().invoke(cli, ["token", "create", "--name", "from-cli", "--scopes", "tunnels:read", "--plain",
                                    "--database-url", settings.database_url], env={"QOSS_TOKEN": None})
    assert made.exit_code == 2
    assert json.loads(made.stderr)["error"] == "Conflict"
    assert "through the service" in made.stderr
    assert made.stdout == ""
    assert "from-cli" not in {t["name"] for t in (await client.get("/v1/tokens")).json()}
    assert [r for r in await audit(client) if r not in before and r["object"].startswith("/v1/tokens/")] == []


def test_the_audit_log_cannot_be_changed_through_the_api() -> None:
    from app.api.routes import admin

    audit_routes = [r for r in admin.router.routes if isinstance(r, APIRoute) and r.path.startswith("/audit")]
    assert [(sorted(r.methods), r.path) for r in audit_routes] == [(["GET"], "/audit")]


async def test_a_bug_is_a_bare_500_and_still_audited(settings: Settings, admin_token: str) -> None:
    app = create_app(settings)

    def boom() -> None:
        raise RuntimeError("a bug with a secret-looking detail: hunter2")

    app.add_api_route("/v1/boom", boom, methods=["POST"])
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        r = await c.post("/v1/boom", headers={"X-Request-ID": "bug-1"})
        assert r.status_code == 500
        assert r.json() == {"error": "InternalError", "detail": "internal error"}
        (record,) = [x for x in await audit(c) if x["client_request_id"] == "bug-1"]
        assert (record["action"], record["object"], record["outcome"], record["detail"]) == (
            "POST", "/v1/boom", 500, "InternalError")


async def test_what_reconcile_at_start_changes_is_audited(settings: Settings, admin_token: str,
                                                          tmp_path: Path) -> None:
    """No request makes the change, yet it gets a record (a fake charon that speaks VICI holds an orphan)."""
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    cfg = settings.model_copy(update={"vici_socket_dirs": [sockets], "reconcile_on_start": False})
    with FakeCharon(sockets / "gw.vici") as fake:
        app = create_app(cfg)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
            headers={"Authorization": f"Bearer {admin_token}"},
        ) as c:
            r = await c.post("/v1/gateways", json={"name": "gw", "vici_socket": str(fake.socket_path),
                                                   "ike_address": "10.99.0.1", "inside_networks": ["10.1.0.0/24"]})
            assert r.status_code == 201, r.text
        ViciGateway(str(fake.socket_path), 5).load_conn("qoss-orphan", {
            "version": "2", "local_addrs": ["10.99.0.1"], "remote_addrs": ["10.99.0.2"],
            "proposals": ["aes128-sha256-modp2048"], "local": {"auth": "psk"}, "remote": {"auth": "psk"}})
        restarted = create_app(cfg.model_copy(update={"reconcile_on_start": True}))
        async with restarted.router.lifespan_context(restarted), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=restarted), base_url="http://qoss.test",
            headers={"Authorization": f"Bearer {admin_token}"},
        ) as c:
            records = [x for x in await audit(c) if x["request_id"].startswith("startup-")]
        assert fake.count("unload-conn") == 1
    assert [(x["action"], x["object"], x["outcome"], x["source"], x["detail"]) for x in records] == [
        ("POST", "/v1/tunnels/reconcile", 200, "local", "reconcile at start: restored=0 failed=0 orphans_removed=1")]
