"""A peer's messages, as a hostile peer or an anonymous client would send them: only a registered,
active peer's signed, sealed, fresh and first-seen message is acted on, and only for what its
peering allows; every refusal leaves nothing behind (no tunnel record, nothing loaded)."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.adapters.agent.crypto import KeyPair, PublicKeys
from app.domain.agent import Kind, canonical
from app.main import create_app
from app.settings import Settings
from tests.fixtures.peering import site_b_app

pytestmark = pytest.mark.anyio


def asgi_client(app: FastAPI, token: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://q.test", headers=headers)


class Calls:
    """A charon that is never reached: a message acted on would load into it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, socket_path: str) -> Any:
        self.asked.append(socket_path)
        raise AssertionError("a refused message reached a charon")


@pytest.fixture
async def site_b(settings: Settings, admin_token: str) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, Calls]]:
    calls = Calls()
    async with site_b_app(settings, vici_factory=calls) as app, asgi_client(app, admin_token) as c:
        yield app, c, calls


_A = KeyPair.generate("site-a")


async def _register(c: httpx.AsyncClient, keys: KeyPair = _A, name: str = "site-a") -> dict[str, Any]:
    public = keys.public.as_dict()
    r = await c.post("/v1/peers", json={"name": name, "url": "http://127.0.0.1:9", **public, "gateways": ["gw-b"],
                                        "networks": ["10.2.0.0/24"], "min_levels": {"confidentiality": 5}})
    assert r.status_code == 201, r.text
    identity: dict[str, Any] = (await c.get("/v1/peering/identity")).json()
    return identity


def _offer(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "tunnel_id": "abc123", "sender": "site-a", "timestamp": int(time.time()), "nonce": secrets.token_urlsafe(18),
        "gateway": "gw-b",
        "initiator": {"address": "10.99.0.1", "identity": "abc123.gw-a", "networks": ["10.1.0.1/32"]},
        "networks": [], "min_levels": {"confidentiality": 5}, "suites": ["aes128gcm16-x25519"],
        "ikes": ["aes128gcm16-prfsha256-x25519"], "mode": "tunnel", "lifetimes": [3600, 1200]}
    doc.update(changes)
    return doc


def _sealed(identity: dict[str, Any], doc: dict[str, Any], *, keys: KeyPair = _A, kind: Kind = Kind.PEER_OFFER,
            to: str = "site-b") -> bytes:
    kem = PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"]).kem
    return keys.seal(kind=kind, to=to, body=canonical(doc), recipient=kem)


async def _post(c: httpx.AsyncClient, data: bytes) -> httpx.Response:
    return await c.post("/v1/peering/messages", content=data, headers={"content-type": "application/json",
                                                                        "Authorization": ""})


async def _nothing_kept(c: httpx.AsyncClient, calls: Calls) -> None:
    assert (await c.get("/v1/tunnels")).json() == []
    assert calls.asked == []


async def test_a_message_of_an_unregistered_sender_is_refused(site_b: Any) -> None:
    _, c, calls = site_b
    identity = (await c.get("/v1/peering/identity")).json()
    r = await _post(c, _sealed(identity, _offer()))
    assert r.status_code == 403, r.text
    await _nothing_kept(c, calls)


async def test_a_message_signed_by_another_key_under_the_peers_name_is_refused(site_b: Any) -> None:
    _, c, calls = site_b
    identity = await _register(c)
    r = await _post(c, _sealed(identity, _offer(), keys=KeyPair.generate("site-a")))
    assert r.status_code == 403, r.text
    await _nothing_kept(c, calls)


@pytest.mark.parametrize("change", [
    {"gateway": "gw-other"},  # a gateway the peering does not allow
    {"networks": ["10.3.0.0/24"]},  # a network outside what it allows
    {"timestamp": int(time.time()) - 600},  # not fresh
    {"sender": "site-c"},  # another peer's name inside
])
async def test_an_offer_beyond_the_peering_or_not_fresh_is_refused_with_nothing_loaded(
        site_b: Any, change: dict[str, Any]) -> None:
    _, c, calls = site_b
    identity = await _register(c)
    r = await _post(c, _sealed(identity, _offer(**change)))
    assert r.status_code == 403, r.text
    await _nothing_kept(c, calls)


async def test_a_replayed_message_is_refused(site_b: Any) -> None:
    _, c, calls = site_b
    identity = await _register(c)
    data = _sealed(identity, _offer(gateway="gw-other"))
    assert (await _post(c, data)).status_code == 403
    again = _sealed(identity, _offer(min_levels={"confidentiality": 10, "integrity": 10}))
    first = await _post(c, again)
    assert first.status_code == 409, first.text  # nothing meets it: refused after the nonce was kept
    replayed = await _post(c, again)
    assert replayed.status_code == 403, replayed.text
    await _nothing_kept(c, calls)


async def test_a_refusal_says_nothing_of_this_sides_ratings(site_b: Any) -> None:
    _, c, calls = site_b
    identity = await _register(c)
    r = await _post(c, _sealed(identity, _offer(min_levels={"confidentiality": 10, "integrity": 10})))
    assert r.status_code == 409, r.text
    assert r.json() == {"error": "PeerNoFeasibleSuite",
                        "detail": "peer site-b: none of the 1 suites offered meets this side's requirements"}
    await _nothing_kept(c, calls)


async def test_a_suspended_peering_takes_no_offer(site_b: Any) -> None:
    _, c, calls = site_b
    identity = await _register(c)
    assert (await c.patch("/v1/peers/site-a", json={"state": "suspended"})).status_code == 200
    r = await _post(c, _sealed(identity, _offer()))
    assert r.status_code == 403, r.text
    await _nothing_kept(c, calls)


@pytest.mark.parametrize("data", [b"", b"{}", b"not json", b"\xff" * 100, b'{"kind":"peer-offer"}' * 10])
async def test_garbage_is_refused_without_a_500(site_b: Any, data: bytes) -> None:
    _, c, calls = site_b
    await _register(c)
    r = await _post(c, data)
    assert r.status_code in (403, 422), r.text
    await _nothing_kept(c, calls)


async def test_a_message_over_the_size_limit_is_refused_unread(site_b: Any) -> None:
    _, c, calls = site_b
    await _register(c)
    r = await _post(c, b"x" * (64 * 1024 + 1))
    assert r.status_code in (413, 422), r.text  # the service's body cap, or the route's own
    await _nothing_kept(c, calls)


async def test_a_peers_kem_key_no_message_can_be_sealed_to_is_refused_at_registration(site_b: Any) -> None:
    _, c, _ = site_b
    r = await c.post("/v1/peers", json={"name": "site-z", "url": "http://127.0.0.1:9", "sign_public_key": "A" * 43,
                                        "kem_public_key": "A" * 43, "gateways": ["gw-b"],
                                        "networks": ["10.2.0.0/24"]})
    assert r.status_code == 422, r.text
    assert (await c.get("/v1/peers")).json() == []


async def test_without_a_peer_name_there_is_no_peering(settings: Settings) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app), asgi_client(app) as c:
        assert (await _post(c, b"{}")).status_code == 404
