"""The agent's message routes answer on a fast path exactly as the full stack does.

Each case is sent twice: through the application (the fast path takes it) and straight into
the full FastAPI stack (what every other route goes through). Status, body, the headers a
client reads and the audit record must agree; bodies the fast path does not take (not
exactly ``{"message": ...}``, too large) must get the full stack's own answer. Refusals are
counted per source and kind, one audit entry per window (``tests/api/test_agent_audit_flood.py``),
so each case here comes from an address of its own.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select
from starlette.types import Receive, Scope, Send

from app import main as api_main
from app.adapters.agent.crypto import KeyPair
from app.adapters.db.models import AuditRow
from app.domain.agent import MAX_WIRE_BYTES, Kind
from app.main import create_app
from app.services.agent.target import Outcome, TargetAgent
from app.settings import Settings
from tests.api.test_agent_roles import enroll, sealed_request
from tests.fixtures.agent_roles import agent_server_config

pytestmark = pytest.mark.anyio

#: The application's client, the full stack's, Target's keys, the app, and a pair of the two
#: clients from an address of one's own (``async with at("192.0.2.1") as (fast, full)``).
Twins = Callable[[str], contextlib.AbstractAsyncContextManager[tuple[httpx.AsyncClient, httpx.AsyncClient]]]
Clients = tuple[httpx.AsyncClient, httpx.AsyncClient, KeyPair, FastAPI, Twins]


@pytest.fixture
async def clients(settings: Settings, admin_token: str, tmp_path: Path) -> AsyncIterator[Clients]:
    config, server_keys = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config, "agent_burst": 10, "agent_rate": 0.01}))

    async def full_stack(scope: Scope, receive: Receive, send: Send) -> None:
        await FastAPI.__call__(app, scope, receive, send)

    headers = {"Authorization": f"Bearer {admin_token}"}

    @contextlib.asynccontextmanager
    async def at(address: str) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=(address, 40_000)), base_url="http://qoss.test",
            headers=headers,
        ) as fast, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=full_stack, client=(address, 40_000)), base_url="http://qoss.test",
            headers=headers,
        ) as full:
            yield fast, full

    async with app.router.lifespan_context(app), at("127.0.0.1") as (fast, full):
        yield fast, full, server_keys, app, at


def _seen(r: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    kept = {k: v for k, v in r.headers.items() if k in ("content-type", "retry-after", "x-request-id")}
    return r.status_code, r.json(), kept


async def _audit(c: httpx.AsyncClient, request_id: str) -> tuple[Any, ...]:
    (record,) = [x for x in (await c.get("/v1/audit")).json() if x["client_request_id"] == request_id]
    return record["action"], record["object"], record["outcome"], record["detail"], record["source"]


async def test_message_routes_answer_as_the_full_stack_does(clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, _, server, _, at = clients
    user = await enroll(reader, "alice")
    stranger = KeyPair.generate("mallory")
    entered: list[str] = []
    guard = api_main._GuardAndAudit.__call__

    async def counting(self: Any, scope: Scope, receive: Receive, send: Send) -> None:
        entered.append(scope["path"])
        await guard(self, scope, receive, send)

    monkeypatch.setattr(api_main._GuardAndAudit, "__call__", counting)
    # Each send gets a body of its own (a sealed request is single use).
    cases: list[tuple[str, str, Callable[[], dict[str, str]]]] = [
        ("rejected", "/v1/agent/requests", lambda: sealed_request(stranger, server)),
        ("garbage", "/v1/agent/target/requests", lambda: {"message": "qoss-agent-1 nonsense"}),
        ("revocation garbage", "/v1/agent/target/revocations", lambda: {"message": "x"}),
        ("charon gone", "/v1/agent/requests", lambda: sealed_request(user, server)),
        ("disconnect unknown", "/v1/agent/requests",
         lambda: sealed_request(user, server, Kind.DISCONNECT, ticket="0" * 32)),
    ]
    for i, (label, path, body) in enumerate(cases):
        entered.clear()
        # Each side from an address of its own: the first refusal of its kind from there.
        async with at(f"192.0.2.{2 * i + 1}") as (fast, _), at(f"192.0.2.{2 * i + 2}") as (_, full):
            a = await fast.post(path, json=body(), headers={"X-Request-ID": f"fast-{len(label)}-{label[:3]}"})
            assert entered == [], label  # the fast path answered
            b = await full.post(path, json=body(), headers={"X-Request-ID": f"full-{len(label)}-{label[:3]}"})
            assert entered == [path], label
        (sa, da, ha), (sb, db, hb) = _seen(a), _seen(b)
        assert (sa, da) == (sb, db), label
        assert len(ha.pop("x-request-id")) == len(hb.pop("x-request-id")) == 32  # ours, never the client's
        assert ha == hb, label
        assert sa in (403, 503), label
        fast_record = await _audit(reader, f"fast-{len(label)}-{label[:3]}")
        full_record = await _audit(reader, f"full-{len(label)}-{label[:3]}")
        assert fast_record[:-1] == full_record[:-1], label  # all but the source
        assert (fast_record[-1], full_record[-1]) == (f"192.0.2.{2 * i + 1}", f"192.0.2.{2 * i + 2}"), label
    # The address limit (burst 10, barely refilling) is shared: the next ones are 429 on both paths.
    fast, full = reader, clients[1]
    for _ in range(10):
        await fast.post("/v1/agent/requests", json=sealed_request(stranger, server))
    a = await fast.post("/v1/agent/requests", json=sealed_request(stranger, server))
    b = await full.post("/v1/agent/requests", json=sealed_request(stranger, server))
    assert a.status_code == b.status_code == 429
    assert _seen(a)[1] == _seen(b)[1]
    assert a.headers["retry-after"] == b.headers["retry-after"]
    assert len(a.headers["x-request-id"]) == 32  # made here


@pytest.mark.parametrize(("body", "status", "error"), [
    ({"message": "x", "extra": 1}, 422, "ValidationError"),
    ({"message": ""}, 422, "ValidationError"),
    ({"message": 42}, 422, "ValidationError"),
    ([{"message": "x"}], 422, "ValidationError"),
    ({"message": "x" * (MAX_WIRE_BYTES + 1)}, 422, "ValidationError"),
])
async def test_bodies_the_fast_path_does_not_take_get_the_full_stacks_answer(
    clients: Clients, body: Any, status: int, error: str
) -> None:
    fast, full, _, _, _ = clients
    a = await fast.post("/v1/agent/requests", json=body)
    b = await full.post("/v1/agent/requests", json=body)
    assert a.status_code == b.status_code == status
    assert a.json() == b.json()
    assert a.json()["error"] == error


async def test_not_json_and_too_large_go_to_the_full_stack(clients: Clients, settings: Settings) -> None:
    fast, full, _, _, _ = clients
    for c in (fast, full):
        r = await c.post("/v1/agent/requests", content=b"{not json", headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["error"]) == (422, "ValidationError")
        big = json.dumps({"message": "x" * (settings.max_body_bytes + 10)}).encode()
        r = await c.post("/v1/agent/requests", content=big, headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["error"]) == (413, "PayloadTooLarge")
    assert (await fast.get("/v1/agent/requests")).status_code == 405  # other methods: the full stack


async def test_with_fast_paths_off_every_message_goes_through_the_full_stack(
    settings: Settings, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, server = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config, "fast_paths": False}))
    entered: list[str] = []
    guard = api_main._GuardAndAudit.__call__

    async def counting(self: Any, scope: Scope, receive: Receive, send: Send) -> None:
        entered.append(scope["path"])
        await guard(self, scope, receive, send)

    monkeypatch.setattr(api_main._GuardAndAudit, "__call__", counting)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        entered.clear()
        r = await c.post("/v1/agent/requests", json=sealed_request(KeyPair.generate("mallory"), server))
        assert r.status_code == 403
        assert entered == ["/v1/agent/requests"]  # the middleware stack answered, not the fast path


async def test_an_answered_message_has_its_record_before_the_answer_leaves(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 200 record is committed in the thread that answered the message, before the answer's
    first byte is sent (a process killed right after answering has recorded what it answered)."""
    _, _, _, app, _ = clients
    monkeypatch.setattr(TargetAgent, "handle", lambda self, data: Outcome(answer=b"qoss-agent-1 sealed",
                                                                          audit="connect user=alice ticket=t1"))
    factory = app.state.runtime.session_factory
    seen: list[tuple[int, str] | None] = []
    sent: list[dict[str, Any]] = []
    body = json.dumps({"message": "qoss-agent-1 whatever"}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/agent/target/requests", "raw_path": b"/v1/agent/target/requests", "query_string": b"",
             "root_path": "", "client": ("10.9.8.7", 4000), "server": ("qoss.test", 80),
             "headers": [(b"host", b"qoss.test"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), (b"x-request-id", b"answered-1")]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            with factory() as session:  # what a reader sees at that moment: committed rows only
                row = session.execute(select(AuditRow.outcome, AuditRow.detail)
                                      .where(AuditRow.client_request_id == "answered-1")).first()
            seen.append(None if row is None else (row[0], row[1]))
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"]) == {"message": "qoss-agent-1 sealed"}
    assert seen == [(200, "connect user=alice ticket=t1")]
