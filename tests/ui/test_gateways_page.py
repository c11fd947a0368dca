"""Gateways in the console: registered (the fields ``POST /v1/gateways`` takes), checked (read
again from charon, as ``POST /v1/gateways/{name}/refresh``) and removed (confirmed; refused while
tunnels use the gateway) with ``gateways:write`` and the CSRF token, audited as the API's changes
are; read-only without the scope. The charons are fakes that speak VICI over a UNIX socket."""

from __future__ import annotations

import asyncio
import html
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.secrets import register
from tests.ui.conftest import client_of, gateway_app, rows, sign_in

pytestmark = pytest.mark.anyio
PSK = "a-pre-shared-key-of-32-characters-or-more"


@pytest.fixture
async def served(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """An app with the gateway ``left`` (a fake charon) and an admin's API client."""
    async with gateway_app(settings, tmp_path) as (app, api):
        yield app, api


def _names(settings: Settings) -> list[str]:
    return [str(r[0]) for r in rows(settings, "SELECT name FROM gateways ORDER BY name")]


def _text(answer: httpx.Response) -> str:
    return html.unescape(answer.text)


async def test_without_gateways_write_the_page_is_read_only(
        served: tuple[Any, httpx.AsyncClient], token: Callable[..., str], tmp_path: Path) -> None:
    app, _ = served
    async with client_of(app) as client:
        csrf = await sign_in(client, token("reader", ["tunnels:read"]))
        listing = await client.get("/ui/gateways")
        assert listing.status_code == 200
        assert '<tr id="gateway-left">' in listing.text
        assert 'data-events="gateway.refreshed gateway.registered gateway.deleted"' in listing.text
        for absent in ("Register a gateway", 'action="/ui/gateways/left/check"', "/ui/gateways/left/remove"):
            assert absent not in listing.text, absent
        form = {"csrf": csrf, "name": "right", "vici_socket": str(tmp_path / "right.vici"),
                "ike_address": "10.99.0.2", "inside_networks": "10.2.0.0/24"}
        assert (await client.post("/ui/gateways", data=form)).status_code == 403
        assert (await client.post("/ui/gateways/left/check", data={"csrf": csrf})).status_code == 403
        assert (await client.post("/ui/gateways/left/remove", data={"csrf": csrf})).status_code == 403
        assert (await client.get("/ui/gateways/left/remove")).status_code == 403


async def test_registering_checks_the_charon_first_and_bad_input_keeps_nothing(
        served: tuple[Any, httpx.AsyncClient], token: Callable[..., str], tmp_path: Path,
        settings: Settings) -> None:
    app, _ = served
    with FakeCharon(tmp_path / "right.vici") as right:
        async with client_of(app) as client:
            csrf = await sign_in(client, token("netadmin", ["gateways:write", "tunnels:read"]))
            good = {"csrf": csrf, "name": "right", "vici_socket": str(right.socket_path),
                    "ike_address": "10.99.0.2", "identity": "", "inside_networks": "10.2.0.0/24\n10.3.0.0/24"}
            for change, status, message in (
                    ({"name": ""}, 422, "name:"),
                    ({"inside_networks": "  "}, 422, "inside_networks:"),
                    ({"ike_address": "not-an-address"}, 422, "is not an IP address"),
                    ({"vici_socket": "/etc/charon.vici"}, 422, "vici_socket must be under one of"),
                    ({"vici_socket": str(tmp_path / "nobody.vici")}, 503, "no charon answered on that socket"),
                    ({"name": "left"}, 409, "left")):
                answer = await client.post("/ui/gateways", data={**good, **change})
                assert answer.status_code == status, (change, answer.text)
                assert "Not registered: " in _text(answer), change
                assert message in _text(answer), change
                assert 'id="gw-address"' in answer.text  # the form again, with what was typed
                assert f'value="{html.escape({**good, **change}["ike_address"])}"' in answer.text
            assert _names(settings) == ["left"]
            assert right.count("version") == 1  # only the name taken got as far as charon
            made = await client.post("/ui/gateways", data=good)
            assert made.status_code == 303, made.text
            assert made.headers["location"] == "/ui/gateways?registered=right"
            listing = await client.get(made.headers["location"])
            assert "Gateway right is registered." in listing.text
            assert '<tr id="gateway-right">' in listing.text
            assert "10.2.0.0/24, 10.3.0.0/24" in listing.text
            assert right.count("version") == 2
    assert _names(settings) == ["left", "right"]
    assert rows(settings, "SELECT kind, subject FROM events WHERE kind LIKE 'gateway.%' ORDER BY id") == [
        ("gateway.registered", "left"), ("gateway.registered", "right")]
    await asyncio.to_thread(app.state.runtime.auditor.flush)
    audit = rows(settings, "SELECT object, outcome, token_name FROM audit_events WHERE object = '/ui/gateways' "
                            "AND outcome = 303")
    assert audit == [("/ui/gateways", 303, "netadmin")]


async def test_checking_shows_the_charons_answer_or_why_there_is_none(
        served: tuple[Any, httpx.AsyncClient], token: Callable[..., str], tmp_path: Path,
        settings: Settings) -> None:
    app, api = served
    with FakeCharon(tmp_path / "right.vici") as right:
        made = await api.post("/v1/gateways", json={"name": "right", "vici_socket": str(right.socket_path),
                                                    "ike_address": "10.99.0.3", "inside_networks": ["10.3.0.0/24"]})
        assert made.status_code == 201, made.text
        async with client_of(app) as client:
            csrf = await sign_in(client, token("netadmin", ["gateways:write", "tunnels:read"]))
            checked = await client.post("/ui/gateways/right/check", data={"csrf": csrf})
            assert checked.status_code == 200, checked.text
            shown = _text(checked)
            assert "right checked: its charon answers" in shown
            assert made.json()["version"] in shown
            assert ", as before" in shown
            right.stop()
            gone = await client.post("/ui/gateways/right/check", data={"csrf": csrf})
            assert gone.status_code == 503
            assert "right not checked: strongSwan unreachable at " in _text(gone)
            assert "no charon answered on that socket" in _text(gone)
            assert (await client.post("/ui/gateways/nowhere/check", data={"csrf": csrf})).status_code == 404
            assert (await client.post("/ui/gateways/right/check", data={})).status_code == 403  # no CSRF token
    refreshed = rows(settings, "SELECT subject FROM events WHERE kind = 'gateway.refreshed'")
    assert refreshed == [("right",)]


async def test_removing_asks_first_and_says_why_a_gateway_in_use_stays(
        served: tuple[Any, httpx.AsyncClient], token: Callable[..., str], tmp_path: Path,
        settings: Settings) -> None:
    app, api = served
    register(PSK)
    tunnel = await api.post("/v1/tunnels", json={
        "initiator": "left", "remote_ts": ["10.2.0.0/24"], "min_levels": {"integrity": 5},
        "peer": {"address": "10.99.0.2", "identity": "peer.example", "psk": PSK}})
    assert tunnel.status_code == 201, tunnel.text
    with FakeCharon(tmp_path / "right.vici") as right:
        made = await api.post("/v1/gateways", json={"name": "right", "vici_socket": str(right.socket_path),
                                                    "ike_address": "10.99.0.3", "inside_networks": ["10.3.0.0/24"]})
        assert made.status_code == 201, made.text
    async with client_of(app) as client:
        csrf = await sign_in(client, token("netadmin", ["gateways:write", "tunnels:read"]))
        confirm = await client.get("/ui/gateways/left/remove")
        assert confirm.status_code == 200
        assert "Remove gateway left?" in confirm.text
        assert 'action="/ui/gateways/left/remove"' in confirm.text
        refused = await client.post("/ui/gateways/left/remove", data={"csrf": csrf})
        assert refused.status_code == 409
        assert f"left is not removed: gateway left carries tunnels ['{tunnel.json()['id']}']" in _text(refused)
        assert (await client.post("/ui/gateways/right/remove", data={})).status_code == 403  # no CSRF token
        removed = await client.post("/ui/gateways/right/remove", data={"csrf": csrf})
        assert removed.status_code == 303
        assert "Gateway right is removed." in (await client.get(removed.headers["location"])).text
    assert _names(settings) == ["left"]
    await asyncio.to_thread(app.state.runtime.auditor.flush)
    audit = rows(settings, "SELECT object, outcome, token_name, detail FROM audit_events "
                            "WHERE object LIKE '/ui/gateways/%/remove' AND outcome <> 403 ORDER BY id")
    assert audit == [("/ui/gateways/left/remove", 409, "netadmin", "Conflict"),
                     ("/ui/gateways/right/remove", 303, "netadmin", "")]
