"""When a peered set-up's confirm goes out, and what a failure on the peer's side leaves behind.

Two qoss applications in one process, site A and site B, each with a database of its own and
each over a fake charon speaking VICI (A's ``gw-a``, B's ``gw-b``); each registered as the
other's peer through its API. A's messages reach B's own message handling (what B's route does
with them), B's errors answered as B's API answers them. A's charon brings a tunnel up on both
fakes when asked to initiate, after noting whether A's confirm had reached B by then.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.bootstrap import prepare_database
from app.domain.errors import QossError
from app.main import create_app
from app.services.peering import Peering
from app.settings import Settings
from app.web.bypass import render
from app.web.errors import qoss_error_parts
from app.web.runtime import runtime_of
from tests.api.conftest import make_token
from tests.fakes.fake_charon import FakeCharon, Reply
from tests.unit.services.test_tunnels_service import established

pytestmark = pytest.mark.anyio


@dataclass
class Link:
    """A's way to B: each message handed to B's message handling; which of them were sent."""

    b: Peering
    sent: int = 0
    #: Set when A's second message (the confirm, on a set-up that got an answer) is on its way.
    confirming: threading.Event = field(default_factory=threading.Event)
    #: Called before B has A's second message (the confirm).
    before_confirm: Callable[[], None] | None = None

    def post(self, peer: str, url: str, data: bytes, timeout: float) -> tuple[int, bytes]:
        self.sent += 1
        if self.sent == 2:
            self.confirming.set()
            if self.before_confirm is not None:
                self.before_confirm()
        try:
            return 200, self.b.receive(data)
        except QossError as exc:
            status, doc, _, _ = qoss_error_parts(exc)
            return status, render(doc)


@dataclass
class Sites:
    a: httpx.AsyncClient
    b: httpx.AsyncClient
    left: FakeCharon
    right: FakeCharon
    link: Link
    #: Site A's units of work.
    a_units: Callable[[], Any]
    #: For each initiate on A's charon: whether A's confirm was on its way when it was asked.
    confirm_during_initiate: list[bool] = field(default_factory=list)

    def initiate(self, *, wait: float, on: tuple[str, ...] = ("left", "right")) -> None:
        """A's charon, asked to initiate, waits up to ``wait`` s for A's confirm to be on its way,
        then brings the conn up on the fakes ``on`` (each reporting it, as charon does)."""
        def up(message: dict[str, object]) -> Reply:
            self.confirm_during_initiate.append(self.link.confirming.wait(wait))
            name = str(message["ike"])
            for fake in (self.left, self.right):
                if fake.socket_path.endswith(tuple(f"{n}.vici" for n in on)):
                    established(fake, name)
                    fake.emit("child-updown", {"up": "yes", name: fake.sas[name]})
            return Reply({"success": "yes"})
        self.left.script("initiate", up)


def _client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://q.test",
                             headers={"Authorization": f"Bearer {token}"})


async def _register(c: httpx.AsyncClient, other: httpx.AsyncClient, *, gateway: str, vici: str, address: str,
                    inside: str, other_name: str) -> None:
    r = await c.post("/v1/gateways", json={"name": gateway, "vici_socket": vici, "ike_address": address,
                                           "inside_networks": [inside]})
    assert r.status_code == 201, r.text
    identity = (await other.get("/v1/peering/identity")).json()
    r = await c.post("/v1/peers", json={
        "name": other_name, "url": f"http://{other_name}.test", "sign_public_key": identity["sign_public_key"],
        "kem_public_key": identity["kem_public_key"], "gateways": [gateway], "networks": [inside],
        "min_levels": {"confidentiality": 1}})
    assert r.status_code == 201, r.text


def _pair(settings: Settings, admin_token: str, tmp_path: Path) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def pair(**update: Any) -> AsyncIterator[Sites]:
        b_url = f"sqlite:///{tmp_path / 'b.db'}"
        prepare_database(Settings(database_url=b_url))
        b_token = make_token(b_url, "b-admin", ["admin"])
        common = {"vici_socket_dirs": [tmp_path], "monitor_tunnels": False, "reconcile_on_start": False,
                  "peer_timeout": 2.0, **update}
        app_a = create_app(settings.model_copy(update={**common, "peer_name": "site-a"}))
        app_b = create_app(settings.model_copy(update={**common, "peer_name": "site-b", "database_url": b_url}))
        with FakeCharon(tmp_path / "left.vici") as left, FakeCharon(tmp_path / "right.vici") as right:
            async with app_a.router.lifespan_context(app_a), app_b.router.lifespan_context(app_b), \
                    _client(app_a, admin_token) as a, _client(app_b, b_token) as b:
                await _register(a, b, gateway="gw-a", vici=left.socket_path, address="10.99.0.1",
                                inside="10.1.0.1/32", other_name="site-b")
                await _register(b, a, gateway="gw-b", vici=right.socket_path, address="10.99.0.2",
                                inside="10.2.0.1/32", other_name="site-a")
                parts_a, parts_b = runtime_of(app_a), runtime_of(app_b)
                assert parts_a is not None
                assert parts_b is not None
                assert parts_a.peering is not None
                assert parts_b.peering is not None
                link = Link(parts_b.peering)
                parts_a.peering._messenger._link = link  # A's messages go to B in this process
                yield Sites(a, b, left, right, link, parts_a.units)
    return pair


@pytest.fixture
def pair(settings: Settings, admin_token: str, tmp_path: Path) -> Callable[..., Any]:
    return _pair(settings, admin_token, tmp_path)


_ASK = {"initiator": "gw-a", "responder": "gw-b@site-b"}


async def test_the_confirm_goes_out_while_this_side_initiates_and_both_ends_are_up(pair: Any) -> None:
    async with pair() as sites:
        sites.initiate(wait=3.0)
        r = await sites.a.post("/v1/tunnels", json=_ASK)
        assert r.status_code == 201, r.text
        assert sites.confirm_during_initiate == [True]
        assert r.json()["state"] == "up"
        on_b = (await sites.b.get("/v1/tunnels")).json()
        assert [(t["id"], t["state"], t["peer"]["role"]) for t in on_b] == [(r.json()["id"], "up", "responder")]


async def test_with_the_early_confirm_off_the_confirm_follows_this_sides_own_end(pair: Any) -> None:
    async with pair(peer_confirm_early=False) as sites:
        sites.initiate(wait=0.5)
        r = await sites.a.post("/v1/tunnels", json=_ASK)
        assert r.status_code == 201, r.text
        assert sites.confirm_during_initiate == [False]
        on_b = (await sites.b.get("/v1/tunnels")).json()
        assert [t["state"] for t in on_b] == ["up"]


async def test_a_peer_whose_end_never_comes_up_leaves_nothing_on_either_side(pair: Any) -> None:
    async with pair() as sites:
        sites.initiate(wait=3.0, on=("left",))  # B's charon never has the SA
        r = await sites.a.post("/v1/tunnels", json=_ASK)
        assert r.status_code == 502, r.text
        assert "site-b" in r.json()["detail"]
        assert sites.left.conns == {}
        assert sites.right.conns == {}
        assert sites.left.shared == {}
        assert sites.right.shared == {}
        assert (await sites.a.get("/v1/tunnels")).json() == []
        assert (await sites.b.get("/v1/tunnels")).json() == []


async def test_this_sides_record_is_kept_while_the_peer_confirms_and_taken_back_when_it_cannot(pair: Any) -> None:
    async with pair() as sites:
        kept: list[list[str]] = []

        def a_has_kept_its_record() -> None:  # B's answer waits (at most 3 s) for A's record
            until = time.monotonic() + 3.0
            while True:
                with sites.a_units() as uow:
                    ids = [t.id for t in uow.tunnels.list()]
                if ids or time.monotonic() > until:
                    kept.append(ids)
                    return
                time.sleep(0.01)
        sites.link.before_confirm = a_has_kept_its_record
        sites.initiate(wait=3.0, on=("left",))  # B's charon never has the SA: B cannot confirm
        r = await sites.a.post("/v1/tunnels", json=_ASK)
        assert r.status_code == 502, r.text
        assert len(kept) == 1
        assert len(kept[0]) == 1
        assert (await sites.a.get("/v1/tunnels")).json() == []
        assert sites.left.conns == {}
        assert sites.left.shared == {}
        with sites.a_units() as uow:
            events = [(e["kind"], e["subject"], e["data"]) for e in uow.events.after(0, scopes=None)
                      if e["kind"].startswith("tunnel.")]
        assert [(kind, subject) for kind, subject, _ in events] == [("tunnel.created", kept[0][0]),
                                                                    ("tunnel.deleted", kept[0][0])]
        assert "the peer did not confirm its end" in events[1][2]["detail"]
        assert "site-b" in events[1][2]["detail"]
