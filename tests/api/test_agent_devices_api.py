"""A user's devices in the API: the administrator's ``GET /v1/agent/users/{user_id}/devices`` and
``DELETE .../devices/{ticket}`` (scope ``agent:enroll``, audited), and the user's own signed list
through ``POST /v1/agent/requests``, answered sealed to them. With devices enrolled against real
charons: ``tests/integration/agent/test_my_devices.py``."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.adapters.agent.crypto import KeyPair, open_sealed, seal, verify
from app.domain.agent import ClientRequest, Kind, RequestInfo, Response
from app.main import create_app
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config, register_keys

pytestmark = pytest.mark.anyio


@pytest.fixture
async def roles(settings: Settings, admin_token: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                                            KeyPair]]:
    config, server_keys = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        yield c, server_keys


async def enroll(c: httpx.AsyncClient, name: str) -> KeyPair:
    user = KeyPair.generate(name)
    register_keys(user)
    r = await c.post("/v1/agent/users", json={"user_id": name, "objectives": [3], **user.public.as_dict()})
    assert r.status_code == 201, r.text
    return user


async def test_the_administrator_lists_a_users_devices_and_a_revoke_of_no_device_is_a_404(
        roles: tuple[httpx.AsyncClient, KeyPair], settings: Settings) -> None:
    c, _ = roles
    await enroll(c, "alice")
    r = await c.get("/v1/agent/users/alice/devices")
    assert r.status_code == 200, r.text
    assert r.json() == {"user_id": "alice", "devices": [], "unanswered": {}}
    assert (await c.get("/v1/agent/users/nobody/devices")).status_code == 404
    ticket = "ab" * 16
    r = await c.delete(f"/v1/agent/users/alice/devices/{ticket}", headers={"X-Request-ID": "revoke-none"})
    assert r.status_code == 404, r.text
    assert r.json()["error"] == "NotFound"
    assert (await c.delete("/v1/agent/users/alice/devices/not-a-ticket")).status_code == 422
    (record,) = [x for x in (await c.get("/v1/audit")).json() if x["client_request_id"] == "revoke-none"]
    assert (record["action"], record["outcome"]) == ("DELETE", 404)
    # Only a token with agent:enroll may look.
    reader = make_token(settings.database_url, "reader", ["tunnels:read"])
    r = await c.get("/v1/agent/users/alice/devices", headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403
    r = await c.get("/v1/agent/users/alice/devices", headers={"Authorization": ""})
    assert r.status_code == 401


async def test_the_user_asks_for_their_devices_and_the_answer_is_sealed_to_them(
        roles: tuple[httpx.AsyncClient, KeyPair]) -> None:
    c, server = roles
    user = await enroll(c, "bob")
    request = ClientRequest(kind=Kind.DEVICES, request_id=secrets.token_bytes(16), user_id="bob", objective_id=3,
                            request_info=RequestInfo(target=SERVER_ID), host=SERVER_ID, timestamp=int(time.time()))
    wire = seal(kind=Kind.DEVICES, to=SERVER_ID, body=request.body(), signer=user, recipient=server.public.kem)
    r = await c.post("/v1/agent/requests", json={"message": wire.decode("ascii")}, headers={"Authorization": ""})
    assert r.status_code == 200, r.text
    kind, body, tag = open_sealed(r.json()["message"].encode("ascii"), kinds=[Kind.DEVICE_LIST], me=user)
    verify(server.public.sign, kind, body, tag)
    answer = Response.parse(body, kind=kind)
    assert (answer.devices, answer.request_id, answer.user_id) == ((), request.request_id, "bob")
    again = await c.post("/v1/agent/requests", json={"message": wire.decode("ascii")}, headers={"Authorization": ""})
    assert again.status_code == 403  # the same request a second time
