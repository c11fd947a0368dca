"""The agent's Host and Target roles in the API with no charon behind Target's socket.

Whatever reaches charon is a 503 naming the socket (never a 500), nothing is left
configured or leased, and the refusal is audited. The real-charon flows are in
tests/integration/agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.adapters.agent.crypto import KeyPair, seal
from app.adapters.db.agent_rows import AgentLeaseRow, AgentSessionRow
from app.adapters.db.engine import make_engine, make_session_factory
from app.domain.agent import AgentRejected, ClientRequest, Endorsement, EnrolledUser, Kind, RequestInfo
from app.domain.errors import GatewayUnreachable
from app.main import create_app
from app.settings import Settings
from tests.api.test_db_faults import set_connections
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config, register_keys

pytestmark = pytest.mark.anyio


@pytest.fixture
async def roles(settings: Settings, admin_token: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                                            KeyPair, Path]]:
    config, server_keys = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        yield c, server_keys, tmp_path / "sockets" / "no-charon.vici"


def sealed_request(user: KeyPair, server: KeyPair, kind: Kind = Kind.CONNECT, objective_id: int = 3,
                   ticket: str | None = None) -> dict[str, str]:
    request = ClientRequest(kind=kind, request_id=secrets.token_bytes(16), user_id=user.name,
                            objective_id=objective_id, request_info=RequestInfo(target=SERVER_ID, ticket=ticket),
                            host=SERVER_ID, timestamp=int(time.time()))
    wire = seal(kind=kind, to=SERVER_ID, body=request.body(), signer=user, recipient=server.public.kem)
    return {"message": wire.decode("ascii")}


def counts(database_url: str) -> dict[str, int]:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            return {row.__tablename__: s.scalar(select(func.count()).select_from(row)) or 0
                    for row in (AgentSessionRow, AgentLeaseRow)}
    finally:
        engine.dispose()


async def enroll(c: httpx.AsyncClient, name: str) -> KeyPair:
    user = KeyPair.generate(name)
    register_keys(user)
    r = await c.post("/v1/agent/users", json={"user_id": name, "objectives": [1, 3], **user.public.as_dict()})
    assert r.status_code == 201, r.text
    return user


@pytest.mark.parametrize("objective_id", [1, 3], ids=["native", "esp"])
async def test_a_genuine_request_with_charon_gone_is_503_and_leaves_nothing(
    roles: tuple[httpx.AsyncClient, KeyPair, Path], settings: Settings, objective_id: int
) -> None:
    c, server, socket = roles
    user = await enroll(c, "alice")
    r = await c.post("/v1/agent/requests", json=sealed_request(user, server, objective_id=objective_id),
                     headers={"X-Request-ID": "agent-503"})
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "GatewayUnreachable"
    assert str(socket) in r.json()["detail"]
    assert counts(settings.database_url) == {"agent_sessions": 0, "agent_leases": 0}
    assert (await c.get("/v1/agent/sessions")).json() == []
    (record,) = [x for x in (await c.get("/v1/audit")).json() if x["client_request_id"] == "agent-503"]
    assert (record["action"], record["object"], record["outcome"], record["detail"]) == (
        "POST", "/v1/agent/requests", 503, "GatewayUnreachable")


async def test_refusals_before_charon_are_403_with_one_text(
    roles: tuple[httpx.AsyncClient, KeyPair, Path], settings: Settings
) -> None:
    c, server, _ = roles
    user = await enroll(c, "bob")
    stranger = KeyPair.generate("carol")
    register_keys(stranger)
    cases: dict[str, dict[str, Any]] = {
        "not enrolled": sealed_request(stranger, server),
        "objective not allowed": sealed_request(user, server, objective_id=2),
        "unknown ticket": sealed_request(user, server, kind=Kind.DISCONNECT, ticket="0" * 32),
        "sealed to someone else": sealed_request(user, KeyPair.generate("other")),
        "garbage": {"message": "qoss-agent-1 nonsense"},
    }
    bodies = set()
    for label, body in cases.items():
        r = await c.post("/v1/agent/requests", json=body)
        assert r.status_code == 403, (label, r.text)
        bodies.add(r.text)
    assert len(bodies) == 1
    assert counts(settings.database_url) == {"agent_sessions": 0, "agent_leases": 0}
    reasons = [x["detail"] for x in (await c.get("/v1/audit")).json() if x["object"] == "/v1/agent/requests"]
    assert len(reasons) == len(cases)
    assert all(reason.startswith("AgentRejected: ") for reason in reasons)


async def test_enrolment_checks_its_keys_and_conflicts(roles: tuple[httpx.AsyncClient, KeyPair, Path]) -> None:
    c, _, _ = roles
    user = await enroll(c, "dave")
    again = await c.post("/v1/agent/users", json={"user_id": "dave", "objectives": [3], **user.public.as_dict()})
    assert again.status_code == 409
    bad = await c.post("/v1/agent/users", json={"user_id": "erin", "objectives": [3],
                                                "sign_public_key": "A" * 43, "kem_public_key": "_" * 43})
    assert bad.status_code in (201, 422), bad.text  # a point on the curve or a clear refusal, never a 500
    assert (await c.delete("/v1/agent/users/nobody")).status_code == 404


async def test_a_local_endorsement_gets_every_check_but_the_envelope(
    settings: Settings, tmp_path: Path
) -> None:
    """One process playing Host and Target hands the endorsement over unsealed (``url: local``);
    Target still refuses a Host it does not trust, a stale endorsement and a forged client body."""
    config, _ = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))
    async with app.router.lifespan_context(app):
        target = app.state.runtime.agent_target
        user = KeyPair.generate("ivan")
        register_keys(user)
        request = ClientRequest(kind=Kind.CONNECT, request_id=secrets.token_bytes(16), user_id="ivan",
                                objective_id=3, request_info=RequestInfo(target=SERVER_ID), host=SERVER_ID,
                                timestamp=int(time.time()))
        body = request.body()
        good = Endorsement(kind=Kind.ENDORSE, host=SERVER_ID, target=SERVER_ID, nonce=secrets.token_bytes(16),
                           timestamp=int(time.time()),
                           user=EnrolledUser(user_id="ivan", sign_public_key=user.public.sign,
                                             kem_public_key=user.public.kem, objectives=frozenset({3})),
                           client_kind=Kind.CONNECT, client_body=body, client_tag=user.sign(Kind.CONNECT, body))
        for bad, reason in (
            (dataclasses.replace(good, host="mallory"), "unknown host"),
            (dataclasses.replace(good, timestamp=int(time.time()) - 3600), "expired timestamp"),
            (dataclasses.replace(good, client_tag=bytes(64)), "bad signature"),
            (dataclasses.replace(good, user=dataclasses.replace(good.user, objectives=frozenset({2}))),
             "objective 3 not allowed"),
        ):
            with pytest.raises(AgentRejected) as info:
                await asyncio.to_thread(target.handle_local, bad)
            assert reason in info.value.reason
        # The genuine one passes every check and reaches charon (there is none here: 503).
        with pytest.raises(GatewayUnreachable):
            await asyncio.to_thread(target.handle_local, good)
    assert counts(settings.database_url) == {"agent_sessions": 0, "agent_leases": 0}


@pytest.mark.parametrize("db_backend", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
async def test_the_database_gone_is_503_for_an_agent_request_and_spends_nothing(
    roles: tuple[httpx.AsyncClient, KeyPair, Path], settings: Settings
) -> None:
    """Host's checks run as a hot transaction on the DBAPI connection: PostgreSQL refusing
    connections is still a 503 DatabaseUnavailable, the request's nonce is not spent, and once
    the database is back the same request goes on (to Target, whose charon is missing here)."""
    c, server, _ = roles
    user = await enroll(c, "dora")
    body = sealed_request(user, server)
    set_connections(settings.database_url, False)
    try:
        r = await c.post("/v1/agent/requests", json=body)
        assert r.status_code == 503, r.text
        assert r.json() == {"error": "DatabaseUnavailable", "detail": "the database is unavailable"}
    finally:
        set_connections(settings.database_url, True)
    r = await c.post("/v1/agent/requests", json=body)
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "GatewayUnreachable"
    assert counts(settings.database_url) == {"agent_sessions": 0, "agent_leases": 0}
