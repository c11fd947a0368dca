"""One answer for one peer's message whichever path serves it: each case is sent through the
application (the bypass registry takes a message sent as JSON within the limit) and straight into
the full stack, and what the sender and the audit log see must agree; what the registry does not
take (another content type, an empty or oversized body) reaches the full stack."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from app.domain.tunnels import TunnelRecord, TunnelState
from app.main import create_app
from app.settings import Settings
from tests.api.test_peering_messages import Calls, _offer, _register, _sealed
from tests.api.test_tunnels_fast_path import _audit, _entries, _seen
from tests.fixtures.peering import site_b_app
from tests.fixtures.tunnel_records import unit_on

pytestmark = pytest.mark.anyio

#: The application, its full stack alone (each an ASGI app), an admin's client, the requests
#: that reached the full stack, the charon that must never be reached.
Twins = tuple[Any, Any, httpx.AsyncClient, list[str], Calls]
_SOURCES = iter(range(1, 250))


def _from(app: Any, headers: dict[str, str]) -> httpx.AsyncClient:
    """A client from an address of its own: its first refusal of a kind has a record of its own
    (later ones from the same source are counted in that record's window)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(f"192.0.2.{next(_SOURCES)}", 4000)),
                             base_url="http://q.test", headers=headers)


@pytest.fixture
async def twins(settings: Settings, admin_token: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Twins]:
    async with _twins(settings, admin_token, monkeypatch) as made:
        yield made


@pytest.fixture
async def limited_twins(settings: Settings, admin_token: str, monkeypatch: pytest.MonkeyPatch,
                        ) -> AsyncIterator[Twins]:
    """The twins, each peer held to 3 messages (refilled at one per 100 s)."""
    async with _twins(settings, admin_token, monkeypatch, peer_burst=3, peer_rate=0.01) as made:
        yield made


@contextlib.asynccontextmanager
async def _twins(settings: Settings, admin_token: str, monkeypatch: pytest.MonkeyPatch,
                 **limits: Any) -> AsyncIterator[Twins]:
    entered = _entries(monkeypatch)
    calls = Calls()
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with site_b_app(settings, vici_factory=calls, **limits) as app, _from(app, headers) as admin:
        async def full_stack(scope: Scope, receive: Receive, send: Send) -> None:
            await FastAPI.__call__(app, scope, receive, send)

        yield app, full_stack, admin, entered, calls


async def _both(twins: Twins, label: str, body: Any, *, fast_path: bool,
                content_type: str | None = "application/json") -> tuple[httpx.Response, httpx.Response]:
    """Send one message (``body``: the same bytes, or a function of 0 or 1) through the
    application, then the full stack; check the registry took it (or not) and that both agree."""
    fast, full, admin, entered, calls = twins
    answers = []
    for i, (target, side) in enumerate(((fast, "fast"), (full, "full"))):
        entered.clear()
        headers = {"X-Request-ID": f"{side}-{label}"}
        if content_type is not None:
            headers["content-type"] = content_type
        async with _from(target, {}) as c:
            r = await c.post("/v1/peering/messages", content=body(i) if callable(body) else body, headers=headers)
        if i == 0:
            assert entered == ([] if fast_path else ["POST /v1/peering/messages"]), label
        answers.append(r)
    a, b = answers
    assert _seen(a) == _seen(b), label
    records = await _audit(admin, f"fast-{label}")
    assert records == await _audit(admin, f"full-{label}"), label
    assert len(records) == 1, label
    assert calls.asked == []
    return a, b


async def test_a_message_of_an_unregistered_sender_is_refused_alike(twins: Twins) -> None:
    identity = (await twins[2].get("/v1/peering/identity")).json()
    a, _ = await _both(twins, "unregistered", lambda i: _sealed(identity, _offer()), fast_path=True)
    assert a.status_code == 403, a.text


async def test_an_offer_beyond_the_peering_is_refused_alike(twins: Twins) -> None:
    identity = await _register(twins[2])
    a, _ = await _both(twins, "beyond", lambda i: _sealed(identity, _offer(gateway="gw-other")), fast_path=True)
    assert a.status_code == 403, a.text


async def test_an_offer_nothing_meets_is_refused_alike_with_one_record_each(twins: Twins) -> None:
    identity = await _register(twins[2])
    a, _ = await _both(twins, "infeasible", lambda i: _sealed(
        identity, _offer(min_levels={"confidentiality": 10, "integrity": 10})), fast_path=True)
    assert a.status_code == 409, a.text
    assert len(await _audit(twins[2], "fast-infeasible")) == 1


async def test_a_replayed_offer_is_refused_alike(twins: Twins) -> None:
    identity = await _register(twins[2])
    sent = [_sealed(identity, _offer(min_levels={"confidentiality": 10, "integrity": 10})) for _ in range(2)]
    for target, data in ((twins[0], sent[0]), (twins[1], sent[1])):  # each seen once
        async with _from(target, {}) as c:
            r = await c.post("/v1/peering/messages", content=data, headers={"content-type": "application/json"})
        assert r.status_code == 409, r.text
    a, _ = await _both(twins, "replayed", lambda i: sent[i], fast_path=True)
    assert a.status_code == 403, a.text


@pytest.mark.parametrize("data", [b"not json", b"{}", b"\xff" * 100])
async def test_garbage_sent_as_json_is_refused_alike(twins: Twins, data: bytes) -> None:
    await _register(twins[2])
    a, _ = await _both(twins, "garbage", data, fast_path=True)
    assert a.status_code in (403, 422), a.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/octet-stream"])
async def test_a_message_sent_as_another_content_type_reaches_the_full_stack(twins: Twins,
                                                                            content_type: str | None) -> None:
    identity = (await twins[2].get("/v1/peering/identity")).json()
    a, _ = await _both(twins, "other-type", lambda i: _sealed(identity, _offer()), fast_path=False,
                       content_type=content_type)
    assert a.status_code == 403, a.text


@pytest.mark.parametrize("data", [b"", b"x" * (64 * 1024 + 1)])
async def test_an_empty_or_oversized_message_reaches_the_full_stack(twins: Twins, data: bytes) -> None:
    await _register(twins[2])
    a, _ = await _both(twins, "size", data, fast_path=False)
    assert a.status_code in (403, 413, 422), a.text


async def test_with_the_fast_paths_off_every_message_takes_the_full_stack(settings: Settings,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    entered = _entries(monkeypatch)
    app = create_app(settings.model_copy(update={"peer_name": "site-b", "fast_paths": False,
                                                 "monitor_tunnels": False, "reconcile_on_start": False}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://q.test") as c:
        entered.clear()
        r = await c.post("/v1/peering/messages", content=b"{}", headers={"content-type": "application/json"})
    assert r.status_code in (403, 422), r.text
    assert entered == ["POST /v1/peering/messages"]


async def test_an_offer_for_a_tunnel_id_this_side_has_is_refused_with_nothing_loaded(
        twins: Twins, settings: Settings) -> None:
    identity = await _register(twins[2])
    with unit_on(settings.database_url) as uow:
        for tunnel_id in ("abc123", "abc124"):
            uow.tunnels.add(TunnelRecord(id=tunnel_id, initiator="gw-b", responder="gw-b", local_ts=("10.2.0.0/24",),
                                         remote_ts=("10.1.0.1/32",), state=TunnelState.UP, negotiation={}))
        uow.commit()
    a, _ = await _both(twins, "taken", lambda i: _sealed(identity, _offer(tunnel_id=f"abc12{3 + i}")),
                       fast_path=True)
    assert a.status_code == 403, a.text
    (record,) = await _audit(twins[2], "fast-taken")
    assert record[3] == "AgentRejected: a tunnel of that id exists here"


async def test_a_peer_past_its_rate_is_refused_alike_with_one_record_each(limited_twins: Twins) -> None:
    fast, full, admin, entered, calls = limited_twins
    identity = await _register(admin)
    infeasible = {"confidentiality": 10, "integrity": 10}
    async with _from(fast, {}) as flooding:
        for _ in range(3):
            r = await flooding.post("/v1/peering/messages", content=_sealed(identity, _offer(min_levels=infeasible)),
                                    headers={"content-type": "application/json"})
            assert r.status_code == 409, r.text
    answers = []
    for i, (target, side) in enumerate(((fast, "fast"), (full, "full"))):
        entered.clear()
        async with _from(target, {}) as c:
            answers.append(await c.post("/v1/peering/messages", content=_sealed(identity, _offer()), headers={
                "content-type": "application/json", "X-Request-ID": f"{side}-limited"}))
        assert entered == ([] if i == 0 else ["POST /v1/peering/messages"])
    a, b = answers
    assert a.status_code == b.status_code == 429, a.text
    assert a.json() == b.json() == {"error": "RateLimited", "detail": "rate limit exceeded for this peer"}
    # One refill of 100 s: the same wait, give or take the second that may have passed between them.
    assert 99 <= int(b.headers["retry-after"]) <= int(a.headers["retry-after"]) <= 100
    assert [k for k in a.headers if k != "retry-after"] == [k for k in b.headers if k != "retry-after"]
    records = await _audit(admin, "fast-limited")
    assert records == await _audit(admin, "full-limited")
    assert records == [("POST", "/v1/peering/messages", 429, "rate limited: peer=site-a", None, [])]
    assert calls.asked == []
