"""Registering a gateway: charon is read before any write (a socket that never answers holds no
write slot), only sockets really under ``vici_socket_dirs`` are read, and every way of not
being a charon gets the same answer."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fakes.fake_charon import FakeCharon
from tests.fakes.not_a_charon import Behaviour, NotACharon, refused_socket

pytestmark = pytest.mark.anyio

NO_CHARON = {"error": "GatewayUnreachable",
             "detail": "strongSwan unreachable at {path}: no charon answered on that socket"}


def gateway(name: str, path: str | Path) -> dict[str, Any]:
    return {"name": name, "vici_socket": str(path), "ike_address": "10.99.0.1", "inside_networks": ["10.1.0.0/24"]}


@asynccontextmanager
async def served(settings: Settings, admin_token: str, **changes: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"monitor_tunnels": False, "reconcile_on_start": False, **changes}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test", timeout=60,
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as c:
        yield c


async def test_registrations_on_silent_sockets_leave_another_tokens_patch_a_write_slot(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    """Twelve registrations on sockets that accept and never answer (more than the ten write
    slots of 40 worker threads) while another token edits a rating table."""
    rater = make_token(settings.database_url, "rater", ["ratings:write"])
    async with served(settings, admin_token, vici_socket_dirs=[tmp_path], gateway_probe_timeout=2.0,
                      vici_timeout=8.0, write_wait_timeout=2.0) as c:
        with NotACharon(tmp_path / "silent.vici", "silent") as silent:
            registrations = [asyncio.ensure_future(c.post("/v1/gateways", json=gateway(f"gw{n}", silent.path)))
                             for n in range(12)]
            try:
                await asyncio.to_thread(silent.wait_for, 12, 5.0)  # every probe is waiting on charon
                patch = await c.patch("/v1/rating-tables/esaf-2006/ratings/md5", json={"integrity": 3},
                                      headers={"If-Match": '"1"', "Authorization": f"Bearer {rater}"})
                answers = await asyncio.wait_for(asyncio.gather(*registrations), 60)
            finally:
                for task in registrations:
                    task.cancel()
        assert patch.status_code == 200, patch.text
        assert [r.status_code for r in answers] == [503] * 12
        assert {r.json()["detail"] for r in answers} == {NO_CHARON["detail"].format(path=silent.path)}
        assert (await c.get("/v1/gateways")).json() == []


async def test_a_link_under_an_allowed_dir_to_a_charon_outside_is_refused_unasked(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    with FakeCharon(outside / "charon.vici") as elsewhere:
        (allowed / "link.vici").symlink_to(elsewhere.socket_path)
        async with served(settings, admin_token, vici_socket_dirs=[allowed]) as c:
            r = await c.post("/v1/gateways", json=gateway("gw", allowed / "link.vici"))
            assert (r.status_code, r.json()) == (503, {
                "error": "GatewayUnreachable", "detail": NO_CHARON["detail"].format(path=allowed / "link.vici")})
            assert (await c.get("/v1/gateways")).json() == []
        assert elsewhere.calls == []  # not one command reached it


async def test_a_socket_reached_through_a_linked_allowed_dir_is_registered_by_its_real_path(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    """An allowed directory that is itself a link (``/var/run`` -> ``/run``) still works."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    with FakeCharon(real / "charon.vici"):
        async with served(settings, admin_token, vici_socket_dirs=[tmp_path / "alias"]) as c:
            r = await c.post("/v1/gateways", json=gateway("gw", tmp_path / "alias" / "charon.vici"))
            assert r.status_code == 201, r.text
            assert r.json()["vici_socket"] == str(real / "charon.vici")


async def test_every_way_of_not_being_a_charon_gets_the_same_answer(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    """Missing, not a socket, refused, reset, garbage, an empty reply, half a reply, a reply too
    large, silence: byte for byte the same answer, so it tells nothing of what is there."""
    path = tmp_path / "gw.vici"
    bodies: dict[str, bytes] = {}
    async with served(settings, admin_token, vici_socket_dirs=[tmp_path], gateway_probe_timeout=1.0,
                      vici_timeout=3.0) as c:

        async def register(kind: str) -> None:
            r = await asyncio.wait_for(c.post("/v1/gateways", json=gateway("gw", path)), 30)
            bodies[kind] = r.content
            assert r.status_code == 503, (kind, r.text)

        await register("missing")
        path.write_text("not a socket")
        await register("regular file")
        path.unlink()
        os.mkfifo(path)
        await register("fifo")
        path.unlink()
        refused_socket(path)
        await register("refused")
        path.unlink()
        behaviours: tuple[Behaviour, ...] = ("reset", "garbage", "frame", "half", "huge", "silent")
        for behaviour in behaviours:
            with NotACharon(path, behaviour):
                await register(behaviour)
        assert (await c.get("/v1/gateways")).json() == []
    expected = httpx.Response(503, json={"error": NO_CHARON["error"],
                                         "detail": NO_CHARON["detail"].format(path=path)}).content
    assert {kind: body for kind, body in bodies.items() if body != expected} == {}


async def test_a_socket_that_answers_garbage_is_not_registered_and_a_charon_there_then_is(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    path = tmp_path / "gw.vici"
    async with served(settings, admin_token, vici_socket_dirs=[tmp_path], gateway_probe_timeout=1.0) as c:
        behaviours: tuple[Behaviour, ...] = ("garbage", "frame")
        for behaviour in behaviours:
            with NotACharon(path, behaviour):
                r = await c.post("/v1/gateways", json=gateway("gw", path))
                assert r.status_code == 503, r.text
            assert (await c.get("/v1/gateways")).json() == []
        with FakeCharon(path):
            r = await c.post("/v1/gateways", json=gateway("gw", path))
            assert r.status_code == 201, r.text
            assert r.json()["version"] == "charon 5.9.8"


async def test_a_refresh_on_a_silent_socket_gets_the_same_answer_and_keeps_the_record(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    path = tmp_path / "gw.vici"
    async with served(settings, admin_token, vici_socket_dirs=[tmp_path], gateway_probe_timeout=1.0) as c:
        with FakeCharon(path):
            assert (await c.post("/v1/gateways", json=gateway("gw", path))).status_code == 201
        with NotACharon(path, "silent"):
            r = await asyncio.wait_for(c.post("/v1/gateways/gw/refresh"), 30)
        assert (r.status_code, r.json()) == (503, {"error": NO_CHARON["error"],
                                                   "detail": NO_CHARON["detail"].format(path=path)})
        assert (await c.get("/v1/gateways/gw")).json()["version"] == "charon 5.9.8"
