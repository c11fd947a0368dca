"""What B's charon holds while it answers an offer: its end is loaded before its record is kept,
so whatever could not be kept after the load is unloaded, and no offer's load ever replaces
another tunnel's conn (an id this side has, or is loading now, is refused before anything is
loaded). Site B in-process over a fake charon speaking VICI; site A's messages made by hand."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.adapters.agent.crypto import KeyPair, PublicKeys
from app.adapters.vici.gateway import ViciGateway
from app.domain.agent import Kind, b64e, canonical
from app.services.peering import responder
from app.settings import Settings
from app.web.runtime import runtime_of
from tests.fakes.fake_charon import FakeCharon, Reply
from tests.fixtures.peering import site_b_app
from tests.fixtures.tunnel_records import add_tunnel_records

pytestmark = pytest.mark.anyio

_A = KeyPair.generate("site-a")


def _vici(path: str) -> ViciGateway:
    return ViciGateway(path, 10.0, pool=None)


@pytest.fixture
async def site_b(settings: Settings, admin_token: str, tmp_path: Path
                 ) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, FakeCharon, dict[str, Any]]]:
    with FakeCharon(tmp_path / "charon.vici") as fake:
        async with (site_b_app(settings, vici_factory=_vici, vici_socket=str(fake.socket_path)) as app,
                    httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://q.test",
                                      headers={"Authorization": f"Bearer {admin_token}"}) as c):
            r = await c.post("/v1/peers", json={
                "name": "site-a", "url": "http://127.0.0.1:9", "sign_public_key": b64e(_A.public.sign),
                "kem_public_key": b64e(_A.public.kem), "gateways": ["gw-b"], "networks": ["10.2.0.0/24"],
                "min_levels": {"confidentiality": 1}})
            assert r.status_code == 201, r.text
            yield app, c, fake, (await c.get("/v1/peering/identity")).json()


def _offer(tunnel_id: str, *, nonce: str | None = None, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "tunnel_id": tunnel_id, "sender": "site-a", "timestamp": int(time.time()),
        "nonce": nonce or secrets.token_urlsafe(18), "gateway": "gw-b",
        "initiator": {"address": "10.99.0.1", "identity": f"{tunnel_id}.gw-a", "networks": ["10.1.0.1/32"]},
        "networks": [], "min_levels": {"confidentiality": 1}, "suites": ["aes128gcm16-x25519"],
        "ikes": ["aes128gcm16-prfsha256-x25519"], "mode": "tunnel", "lifetimes": [3600, 1200]}
    doc.update(changes)
    return doc


async def _send(c: httpx.AsyncClient, identity: dict[str, Any], doc: dict[str, Any]) -> httpx.Response:
    kem = PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"]).kem
    data = _A.seal(kind=Kind.PEER_OFFER, to="site-b", body=canonical(doc), recipient=kem)
    return await c.post("/v1/peering/messages", content=data, headers={"content-type": "application/json"})


async def test_an_offer_for_an_id_being_loaded_now_is_refused_and_leaves_the_first_load_alone(site_b: Any) -> None:
    _, c, fake, identity = site_b
    loading, go_on = threading.Event(), threading.Event()

    def slow_load(message: dict[str, Any]) -> Reply:
        loading.set()
        go_on.wait(5)
        fake.conns.update(message)
        return Reply({"success": "yes"})
    fake.script("load-conn", slow_load, once=True)
    first = asyncio.ensure_future(_send(c, identity, _offer("t1")))
    for _ in range(500):  # at most 5 s
        if loading.is_set():
            break
        await asyncio.sleep(0.01)
    assert loading.is_set()
    second = await _send(c, identity, _offer("t1"))
    assert second.status_code == 403, second.text
    assert list(fake.conns) == []  # the second offer loaded nothing
    go_on.set()
    answered = await first
    assert answered.status_code == 200, answered.text
    assert list(fake.conns) == ["qoss-t1"]
    assert [(t["id"], t["state"]) for t in (await c.get("/v1/tunnels")).json()] == [("t1", "configuring")]


async def test_an_offer_for_an_id_this_side_has_is_refused_before_anything_is_loaded(site_b: Any) -> None:
    _, c, fake, identity = site_b
    assert (await _send(c, identity, _offer("t2"))).status_code == 200
    psk_owners = dict(fake.shared)
    loads = []
    fake.script("load-conn", lambda m: (loads.append(m), Reply({"success": "yes"}))[1])
    again = await _send(c, identity, _offer("t2"))
    assert again.status_code == 403, again.text
    assert loads == []
    assert fake.shared == psk_owners  # the first tunnel's secret is the one loaded, untouched
    assert [t["id"] for t in (await c.get("/v1/tunnels")).json()] == ["t2"]


async def test_an_offer_whose_record_cannot_be_kept_after_its_load_is_unloaded(site_b: Any) -> None:
    _, c, fake, identity = site_b
    # A nonce kept by an offer refused for want of a suite, sent again on an offer that can be met:
    # nothing tells it apart before the load, and its record (the nonce with it) cannot be kept.
    nonce = secrets.token_urlsafe(18)
    refused = await _send(c, identity, _offer("t3", nonce=nonce, suites=["3des-sha1-modp1024"]))
    assert refused.status_code == 409, refused.text
    replayed = await _send(c, identity, _offer("t4", nonce=nonce))
    assert replayed.status_code == 403, replayed.text
    assert fake.conns == {}
    assert fake.shared == {}
    assert (await c.get("/v1/tunnels")).json() == []


async def test_the_sweep_unloads_every_load_never_confirmed_a_page_at_a_time_and_nothing_else(
        site_b: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    app, c, fake, identity = site_b
    for tunnel_id in ("t1", "t2", "t3"):
        r = await _send(c, identity, _offer(tunnel_id))
        assert r.status_code == 200, r.text
    add_tunnel_records(settings.database_url, 4)  # this side's own tunnels, up or down: not the sweep's
    assert {f"qoss-{t}" for t in ("t1", "t2", "t3")} <= set(fake.conns)
    parts = runtime_of(app)
    assert parts is not None
    assert parts.peering is not None
    monkeypatch.setattr(responder, "SWEEP_PAGE", 2)  # three loads never confirmed: two pages
    monkeypatch.setattr(responder, "PENDING_FOR", -1.0)  # every one of them overdue
    assert await asyncio.to_thread(parts.peering.sweep) == 3
    assert not {f"qoss-{t}" for t in ("t1", "t2", "t3")} & set(fake.conns)
    listed = (await c.get("/v1/tunnels")).json()
    assert sorted(t["id"] for t in listed) == ["t000", "t001", "t002", "t003"]
