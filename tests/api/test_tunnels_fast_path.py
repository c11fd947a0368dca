"""A tunnel's create and delete answer on a fast path exactly as the full stack does.

Each case is sent through the application (the fast path takes it when the token was checked
within ``token_cache_ttl`` and holds the scope) and straight into the full FastAPI stack.
Status, body, the headers a client reads and the audit record must agree; what the fast path
does not take (no token, a token without the scope, a body the model refuses, a malformed
``Idempotency-Key``) gets the full stack's own answer through the application too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.types import Receive, Scope, Send

from app import main as api_main
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.domain.auth import parse_token
from app.main import create_app
from app.services import tunnels as tunnel_service
from app.services.auth import revoke_token
from app.settings import Settings
from app.web.runtime import runtime_of
from tests.api.conftest import make_token
from tests.api.test_idempotency import PSK_A, PSK_B, tunnel
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.secrets import register
from tests.unit.services.test_tunnels_service import up_on_initiate

pytestmark = pytest.mark.anyio

Clients = tuple[httpx.AsyncClient, httpx.AsyncClient, FakeCharon, list[str]]


def _entries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The requests that reach the full stack's middleware ("METHOD /path"), from now on."""
    entered: list[str] = []
    guard = api_main._GuardAndAudit.__call__

    async def counting(self: Any, scope: Scope, receive: Receive, send: Send) -> None:
        entered.append(f"{scope['method']} {scope['path']}")
        await guard(self, scope, receive, send)

    monkeypatch.setattr(api_main._GuardAndAudit, "__call__", counting)
    return entered


@pytest.fixture
async def clients(settings: Settings, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  ) -> AsyncIterator[Clients]:
    for psk in (PSK_A, PSK_B):
        register(psk)
    entered = _entries(monkeypatch)
    with FakeCharon(tmp_path / "left.vici") as fake:
        up_on_initiate(fake)
        app = create_app(settings.model_copy(update={
            "vici_socket_dirs": [tmp_path], "monitor_tunnels": False, "token_cache_ttl": 60}))

        async def full_stack(scope: Scope, receive: Receive, send: Send) -> None:
            await FastAPI.__call__(app, scope, receive, send)

        headers = {"Authorization": f"Bearer {admin_token}"}
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test", headers=headers,
        ) as fast, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=full_stack), base_url="http://qoss.test", headers=headers,
        ) as full:
            r = await fast.post("/v1/gateways", json={"name": "left", "vici_socket": str(fake.socket_path),
                                                      "ike_address": "10.99.0.1", "inside_networks": ["10.1.0.0/24"]})
            assert r.status_code == 201, r.text  # the token is now checked, and cached
            # On PostgreSQL the caches trust nothing until this process follows the replicas' change
            # notices, and are emptied as it starts to (a moment after start): until the token is
            # cached, a read checks it again.
            parts = runtime_of(app)
            assert parts is not None
            token_id, _ = parse_token(admin_token)
            for _ in range(100):  # at most ~10 s
                if parts.token_cache.fresh(token_id) is not None:
                    break
                await asyncio.sleep(0.1)
                assert (await fast.get("/v1/gateways")).status_code == 200
            assert parts.token_cache.fresh(token_id) is not None
            yield fast, full, fake, entered


def _seen(r: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    kept = {k: v for k, v in r.headers.items()
            if k in ("content-type", "content-length", "retry-after", "idempotent-replayed", "www-authenticate")}
    assert len(r.headers["x-request-id"]) == 32  # ours, never the client's
    body = r.json() if r.content else None
    if isinstance(body, dict) and r.status_code == 201:  # a new tunnel each time: its own id and names
        body = {k: v for k, v in body.items() if k not in ("id", "conn", "created_at", "updated_at", "peer")}
        kept.pop("content-length")
    return r.status_code, body, kept


async def _audit(c: httpx.AsyncClient, request_id: str) -> list[tuple[Any, ...]]:
    """The request's own audit records (a refusal anyone can send in bulk has none: it is counted
    with those of its kind from its source, one entry per window)."""
    return [(r["action"], r["object"].rsplit("/", 1)[0] if r["action"] == "DELETE" else r["object"], r["outcome"],
             r["detail"], r["token_name"], r["scopes"])
            for r in (await c.get("/v1/audit?limit=1000")).json() if r["client_request_id"] == request_id]


async def _both(clients: Clients, label: str, method: str, path: str | Callable[[int], str], *, fast_path: bool,
                headers: dict[str, str] | Callable[[int], dict[str, str]] | None = None,
                json: Any = None, **kw: Any) -> tuple[httpx.Response, httpx.Response]:
    """Send one case through the application, then the full stack (``path`` and ``headers`` may
    differ per side: a function of 0 or 1); check the fast path took it (or not) and that both
    answered alike and left alike audit records."""
    fast, full, _, entered = clients
    answers = []
    for i, (c, side) in enumerate(((fast, "fast"), (full, "full"))):
        extra = headers(i) if callable(headers) else headers or {}
        entered.clear()
        r = await c.request(method, path(i) if callable(path) else path,
                            headers={**extra, "X-Request-ID": f"{side}-{label}"},
                            json=json(i) if callable(json) else json, **kw)
        if i == 0:
            assert entered == ([] if fast_path else [f"{method} {r.request.url.path}"]), label
        answers.append(r)
    a, b = answers
    assert _seen(a) == _seen(b), label
    if a.status_code not in (401, 403) and label != "not-json":  # bulk refusals: one entry per window and kind
        records = await _audit(fast, f"fast-{label}")
        assert records == await _audit(fast, f"full-{label}"), label
        assert len(records) == 1, label
    return a, b


def _to(psk: str, peer: str) -> Callable[[int], dict[str, Any]]:
    """A tunnel request per side: to a peer identity of its own (one pair of identities, one tunnel)."""

    def body(i: int) -> dict[str, Any]:
        doc = tunnel(psk)
        doc["peer"] = {**doc["peer"], "identity": f"{peer}-{i}.example"}  # type: ignore[dict-item]
        return doc

    return body


async def test_create_and_delete_answer_as_the_full_stack_does(clients: Clients, settings: Settings) -> None:
    made, _ = await _both(clients, "created", "POST", "/v1/tunnels", fast_path=True, json=_to(PSK_A, "a"))
    assert made.status_code == 201
    keys = ["k-fast", "k-full"]  # one key per side: each side's first answer, then its replay
    first, _ = await _both(clients, "keyed", "POST", "/v1/tunnels", fast_path=True, json=_to(PSK_B, "b"),
                           headers=lambda i: {"Idempotency-Key": keys[i]})
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    replayed, _ = await _both(clients, "replayed", "POST", "/v1/tunnels", fast_path=True, json=_to(PSK_B, "b"),
                              headers=lambda i: {"Idempotency-Key": keys[i]})
    assert replayed.headers["idempotent-replayed"] == "true"
    assert replayed.json()["id"] == first.json()["id"]
    infeasible = {**tunnel(PSK_A), "min_levels": {"confidentiality": 10, "integrity": 10, "key_exchange": 10}}
    refused, _ = await _both(clients, "infeasible", "POST", "/v1/tunnels", fast_path=True, json=infeasible)
    assert (refused.status_code, refused.json()["error"]) == (409, "NoFeasibleSuite")
    unknown, _ = await _both(clients, "unknown", "POST", "/v1/tunnels", fast_path=True,
                             json={**tunnel(PSK_A), "initiator": "nowhere"})
    assert unknown.status_code == 404
    fast, _full, fake, _ = clients
    ids = [t["id"] for t in (await fast.get("/v1/tunnels")).json()]
    assert len(ids) == 4  # created and keyed, on each side
    gone, _ = await _both(clients, "deleted", "DELETE", lambda i: f"/v1/tunnels/{ids[i]}", fast_path=True)
    assert gone.status_code == 204
    assert gone.content == b""
    missing, _ = await _both(clients, "missing", "DELETE", "/v1/tunnels/0000", fast_path=True)
    assert missing.status_code == 404
    assert [t["id"] for t in (await fast.get("/v1/tunnels")).json()] == ids[2:]
    assert len(fake.conns) == 2


async def test_what_the_fast_path_does_not_take_gets_the_full_stacks_answer(
        clients: Clients, settings: Settings) -> None:
    reader = make_token(settings.database_url, "reader", ["tunnels:read"])
    await clients[0].get("/v1/tunnels", headers={"Authorization": f"Bearer {reader}"})  # checked, cached
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("no-token", "POST", {"json": tunnel(PSK_A), "headers": {"Authorization": ""}}, 401),
        ("bad-token", "DELETE", {"headers": {"Authorization": "Bearer qoss_000000000000_nope"}}, 401),
        ("read-only", "POST", {"json": tunnel(PSK_A), "headers": {"Authorization": f"Bearer {reader}"}}, 403),
        ("no-initiator", "POST", {"json": {"remote_ts": ["10.2.0.0/24"]}}, 422),
        ("extra-field", "POST", {"json": {**tunnel(PSK_A), "colour": "red"}}, 422),
        ("not-json", "POST", {"content": b"{nope", "headers": {"Content-Type": "application/json"}}, 422),
        ("bad-key", "POST", {"json": tunnel(PSK_A), "headers": {"Idempotency-Key": "a b"}}, 422),
    ]
    for label, method, kw, status in cases:
        path = "/v1/tunnels" if method == "POST" else "/v1/tunnels/abc"
        a, _ = await _both(clients, label, method, path, fast_path=False, **kw)
        assert a.status_code == status, (label, a.text)


@pytest.mark.parametrize("failure", [
    OperationalError("INSERT", {}, ConnectionError("gone")), PoolTimeout("no connection free")],
    ids=["database-down", "pool-exhausted"])
async def test_a_database_failure_is_answered_as_the_full_stack_does(
        clients: Clients, monkeypatch: pytest.MonkeyPatch, failure: Exception) -> None:
    """The set-up's transaction fails: the same 503, document and ``Retry-After`` either way."""

    def fail(**_: Any) -> None:
        raise failure

    monkeypatch.setattr(tunnel_service, "request_tunnel", fail)
    a, _ = await _both(clients, type(failure).__name__, "POST", "/v1/tunnels", fast_path=True,
                       json=_to(PSK_A, "down"))
    assert (a.status_code, a.json()["error"], a.headers["retry-after"]) == (503, "DatabaseUnavailable", "1")


async def test_with_fast_paths_off_a_tunnel_goes_through_the_full_stack(
        settings: Settings, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered = _entries(monkeypatch)
    async with _served(settings, admin_token, tmp_path, fast_paths=False) as (_, c):
        entered.clear()
        made = await c.post("/v1/tunnels", json=tunnel(PSK_A))
        assert made.status_code == 201
        assert (await c.delete(f"/v1/tunnels/{made.json()['id']}")).status_code == 204
        assert entered == ["POST /v1/tunnels", f"DELETE /v1/tunnels/{made.json()['id']}"]


@contextlib.asynccontextmanager
async def _served(settings: Settings, admin_token: str, tmp_path: Path,
                  **update: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """An app over a fake charon registered as gateway ``left`` (``token_cache_ttl`` 60 s, and
    ``update``), and an admin's client of it."""
    register(PSK_A)
    with FakeCharon(tmp_path / "left.vici") as fake:
        up_on_initiate(fake)
        app = create_app(settings.model_copy(update={"vici_socket_dirs": [tmp_path], "monitor_tunnels": False,
                                                     "token_cache_ttl": 60, **update}))
        async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
            headers={"Authorization": f"Bearer {admin_token}"},
        ) as c:
            assert (await c.post("/v1/gateways", json={
                "name": "left", "vici_socket": str(fake.socket_path), "ike_address": "10.99.0.1",
                "inside_networks": ["10.1.0.0/24"]})).status_code == 201
            yield app, c


async def test_a_token_read_longer_ago_than_the_cache_trusts_is_read_again_on_the_fast_path(
        settings: Settings, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``token_cache_ttl`` the fast path reads the token again instead of leaving it to the
    full stack; a token revoked since (by another process: this one's cache was not told) or
    presented with another secret goes to the full stack, which refuses it."""
    entered = _entries(monkeypatch)
    colleague = make_token(settings.database_url, "colleague", ["tunnels:read", "tunnels:write"])
    async with _served(settings, admin_token, tmp_path) as (app, c):
        as_colleague = {"Authorization": f"Bearer {colleague}"}
        assert (await c.get("/v1/tunnels", headers=as_colleague)).status_code == 200  # read, cached
        app.state.runtime.token_cache.ttl = 0  # every read it holds is now older than it trusts
        entered.clear()
        made = await c.post("/v1/tunnels", json=tunnel(PSK_A))
        assert made.status_code == 201, made.text
        assert entered == []  # read again, on the fast path

        token_id = parse_token(colleague)[0]
        engine = make_engine(settings.database_url)
        try:
            with sql_units_of_work(make_session_factory(engine))() as uow:
                revoke_token(uow=uow, token_id=token_id, revoked_by="tests")
                uow.commit()
        finally:
            engine.dispose()
        gone = await c.delete(f"/v1/tunnels/{made.json()['id']}", headers=as_colleague)
        assert gone.status_code == 401, gone.text
        wrong = {"Authorization": f"Bearer {admin_token[:-4]}{'0000' if admin_token[-4:] != '0000' else '1111'}"}
        refused = await c.delete(f"/v1/tunnels/{made.json()['id']}", headers=wrong)
        assert refused.status_code == 401, refused.text
        assert entered == [f"DELETE /v1/tunnels/{made.json()['id']}"] * 2  # both through the full stack
        assert (await c.delete(f"/v1/tunnels/{made.json()['id']}")).status_code == 204
        assert entered == [f"DELETE /v1/tunnels/{made.json()['id']}"] * 2
