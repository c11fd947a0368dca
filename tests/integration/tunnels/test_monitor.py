"""Tunnel state follows charon's own events: an SA torn down behind qoss's back shows ``down``."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.adapters.vici.gateway import ViciGateway
from app.bootstrap import prepare_database
from app.domain.tunnels import TunnelState
from app.lab.hosts import Lab
from app.settings import Settings
from tests.fixtures.waiting import until
from tests.integration.tunnels.conftest import Calls
from tests.integration.tunnels.test_tunnels_api import nothing_left, ping

pytestmark = [pytest.mark.anyio, pytest.mark.charon]


@pytest.fixture
def settings(tmp_path: Path, lab: Lab) -> Settings:
    """As the package's, with the monitor looking at the gateways twice a second."""
    settings = Settings(database_url=f"sqlite:///{tmp_path}/qoss.db", vici_socket_dirs=[lab.state_dir],
                        reconcile_on_start=False, monitor_interval=0.5)
    prepare_database(settings)
    return settings


async def _state_becomes(client: httpx.AsyncClient, tunnel_id: str, state: str, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        listed = {t["id"]: t for t in (await client.get("/v1/tunnels")).json()}
        if listed[tunnel_id]["state"] == state:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_sa_closed_by_the_peer_shows_down_then_up_again(client: httpx.AsyncClient, lab: Lab) -> None:
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    # The responder's administrator (or a crash, or DPD) closes the SA; qoss did nothing.
    right = ViciGateway(lab.host("right").vici_socket, 5.0)
    right.terminate(ike=tunnel["conn"], timeout_ms=3000)
    assert await _state_becomes(client, tunnel["id"], "down")
    listed = {t["id"]: t for t in (await client.get("/v1/tunnels")).json()}
    assert listed[tunnel["id"]]["detail"] == "SA went down (charon event)"
    assert ping(lab).returncode != 0

    # Brought up again from the initiator's side: the record follows.
    ViciGateway(lab.host("left").vici_socket, 10.0).initiate(child=tunnel["conn"], ike=tunnel["conn"])
    assert await _state_becomes(client, tunnel["id"], "up")
    assert ping(lab).returncode == 0

    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab)


async def test_deleted_tunnels_leave_the_monitor_and_the_event_hub_nothing(client: httpx.AsyncClient, lab: Lab,
                                                                            calls: Calls) -> None:
    """A delete terminates the SAs, so both charons send ike-updown and child-updown down, and
    then removes the record: the monitor's checks of those events find no record, ask charon
    nothing and change nothing; afterwards nothing is pending and no set-up waits."""
    app = client.qoss_app  # type: ignore[attr-defined]
    hub, monitor = app.state.runtime.sa_events, app.state.runtime.tunnel_monitor
    sockets = sorted(host.vici_socket for host in lab.hosts)
    assert await asyncio.to_thread(until, lambda: monitor.watched == sockets)
    # Subscribed after the monitor: each event reaches it before it reaches us.
    downs: dict[str, set[str]] = {path: set() for path in sockets}
    subscriptions = [hub.listener(path, lambda event, path=path: downs[path].add(event.ike_name)
                                  if event.up is False else None) for path in sockets]
    for subscription in subscriptions:
        subscription.start()
    deleted: dict[str, int] = {}  # conn -> how many list_sas had been asked when its delete returned
    try:
        for _ in range(3):  # one after the other: they protect the same selectors
            r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
            assert r.status_code == 201, r.text
            assert (await client.delete(f"/v1/tunnels/{r.json()['id']}")).status_code == 204
            deleted[r.json()["conn"]] = len(calls.listed)
        assert await asyncio.to_thread(until, lambda: all(downs[path] >= set(deleted) for path in sockets))
        assert await asyncio.to_thread(until, lambda: monitor.pending == 0)
    finally:
        for subscription in subscriptions:
            subscription.stop()
    asked_after = [conn for conn, at in deleted.items() if conn in calls.listed[at:]]
    assert asked_after == []
    assert monitor.changes == 0
    assert hub.waiting == 0
    assert nothing_left(lab)


async def test_checking_every_tunnel_on_a_charon_asks_each_charon_once(client: httpx.AsyncClient, lab: Lab,
                                                                       calls: Calls) -> None:
    """What a listener's (re)connect does: every tunnel with an end on that charon is checked
    against one whole ``list-sas`` of each charon, none asked by name, and the record follows."""
    app = client.qoss_app  # type: ignore[attr-defined]
    monitor = app.state.runtime.tunnel_monitor
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert await asyncio.to_thread(until, lambda: monitor.pending == 0)  # the set-up's events are dealt with
    with app.state.runtime.units() as uow:  # what a missed event leaves: recorded down while the SA is up
        uow.tunnels.set_state(tunnel["id"], TunnelState.DOWN, "events missed")
        uow.commit()
    before = len(calls.listings)

    def check_all_on() -> list[tuple[str | None, str]]:
        """What this check asked, by conn and socket (the monitor's own resyncs may ask beside it)."""
        monitor.check_all_on(lab.host("right").vici_socket)
        mine = threading.get_ident()
        return [(conn, path) for conn, path, thread in calls.listings[before:] if thread == mine]
    sent = await asyncio.to_thread(check_all_on)
    assert sorted(path for _, path in sent) == sorted(host.vici_socket for host in lab.hosts)
    assert [conn for conn, _ in sent] == [None, None]  # the whole list, not the tunnel's conn
    shown = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert (shown["state"], shown["detail"]) == ("up", "SA established again (charon event)")
    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab)
