"""Tunnels over IPv6 through the real API: IKE and ESP between IPv6 addresses, IPv6 inside.

One lab per module with IPv6 first (``families=(6, 4)``): the gateways are registered with
their IPv6 IKE addresses (``fd00:71::1``, ``fd00:71::2``) and the inside networks of both
families (``fd01::/64`` and ``10.1.0.1/32`` left, ``fd02::/64`` and ``10.2.0.1/32`` right). A
tunnel of IPv6 selectors only carries ``ping -6``; a dual-stack one (both families in its
selectors) carries ``ping`` and ``ping -6``; each is checked with ``swanctl --list-sas`` on
both charons and leaves nothing behind once deleted. An IPv6 tunnel whose responder's charon
restarts is seen ``down`` by the monitor and brought back by reconcile. ``qoss lab up --family 6``
registers the gateways with their IPv6 addresses.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from app.bootstrap import prepare_database
from app.cli.main import app as cli
from app.lab.hosts import Lab, LabHost
from app.main import create_app
from app.settings import Settings
from tests.cli.run import qoss
from tests.integration.tunnels.conftest import Calls, SpyGateway

pytestmark = [pytest.mark.anyio, pytest.mark.charon]


@pytest.fixture(scope="module")
def lab(lab6: Lab) -> Lab:
    """The module's lab with IKE over IPv6 and inside networks of both families (``lab6``,
    tests/integration/conftest.py), in place of the tunnel tests' IPv4 one."""
    return lab6


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(tmp_path: Path, lab: Lab) -> AsyncIterator[httpx.AsyncClient]:
    """The app over a fresh database, the lab's hosts registered as gateways as ``qoss lab up --family 6,4`` does."""
    from tests.api.conftest import make_token

    settings = Settings(database_url=f"sqlite:///{tmp_path}/qoss.db", vici_socket_dirs=[lab.state_dir],
                        reconcile_on_start=False, monitor_interval=0.5)
    prepare_database(settings)
    app = create_app(settings, vici_factory=lambda path: SpyGateway(path, Calls()))  # every PSK joins the leak sweep
    headers = {"Authorization": f"Bearer {make_token(settings.database_url, 'ipv6-tests', ['admin'])}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://qoss.test", timeout=30,
                          headers=headers) as c,
    ):
        for host in lab.hosts:
            r = await c.post("/v1/gateways", json={
                "name": host.name, "vici_socket": host.vici_socket, "ike_address": host.gateway_ike_address,
                "inside_networks": host.inside_networks})
            assert r.status_code == 201, r.text
            assert r.json()["ike_address"] == host.ike_address6
        yield c
        while left_over := (await c.get("/v1/tunnels?limit=1000")).json():
            for t in left_over:
                await c.delete(f"/v1/tunnels/{t['id']}")


def swanctl_sas(host: LabHost) -> str:
    """``swanctl --list-sas`` against the host's charon."""
    done = subprocess.run(["swanctl", "--list-sas", "--uri", f"unix://{host.vici_socket}"],
                          capture_output=True, text=True, timeout=15, check=True)
    return done.stdout


def assert_ipv6_sa(host: LabHost, peer: LabHost, conn: str, local_ts: list[str], remote_ts: list[str]) -> None:
    """``swanctl --list-sas`` on ``host``: conn's IKE_SA established between the IPv6 IKE
    addresses, its ESP CHILD_SA installed in tunnel mode with exactly these selectors."""
    text = swanctl_sas(host)
    assert re.search(rf"^{re.escape(conn)}: #\d+, ESTABLISHED, IKEv2", text, re.M), text
    assert re.search(rf"^\s+local\s+'[^']*' @ {re.escape(host.ike_address6 or '')}\[\d+\]", text, re.M), text
    assert re.search(rf"^\s+remote\s+'[^']*' @ {re.escape(peer.ike_address6 or '')}\[\d+\]", text, re.M), text
    assert re.search(rf"^\s+{re.escape(conn)}: #\d+, reqid \d+, INSTALLED, TUNNEL(-in-UDP)?, ESP:", text, re.M), text
    assert re.search(rf"^\s+local\s+{re.escape(' '.join(local_ts))}$", text, re.M), text
    assert re.search(rf"^\s+remote\s+{re.escape(' '.join(remote_ts))}$", text, re.M), text


def ping(lab: Lab, family: int, count: int = 2, wait: int = 2) -> subprocess.CompletedProcess[str]:
    """From the left namespace, sourced at left's inside address, to right's (``count`` pings,
    ``wait`` seconds for each answer)."""
    left, right = lab.host("left"), lab.host("right")
    source, target = ((left.inside_address6, right.inside_address6) if family == 6
                      else (left.inside_address, right.inside_address))
    assert source is not None
    assert target is not None
    return subprocess.run(["ip", "netns", "exec", left.netns, "ping", f"-{family}", "-c", str(count), "-i", "0.2",
                           "-W", str(wait), "-I", source, target],
                          capture_output=True, text=True, timeout=20, check=False)


def leftovers(lab: Lab) -> dict[str, Any]:
    out = {}
    for host in lab.hosts:
        g = host.gateway(timeout=5.0)
        out[host.name] = {"conns": g.list_conns(), "shared": g.get_shared(), "sas": [s.name for s in g.list_sas()]}
    return out


def nothing_left(lab: Lab) -> bool:
    return all(not any(v.values()) for v in leftovers(lab).values())


async def test_ipv6_tunnel_between_ipv6_addresses_carries_ping6_and_deletes_clean(
        client: httpx.AsyncClient, lab: Lab) -> None:
    left, right = lab.host("left"), lab.host("right")
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "local_ts": ["fd01::/64"], "remote_ts": ["fd02::/64"]})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert tunnel["state"] == "up"
    assert (tunnel["local_ts"], tunnel["remote_ts"]) == (["fd01::/64"], ["fd02::/64"])

    assert_ipv6_sa(left, right, tunnel["conn"], ["fd01::/64"], ["fd02::/64"])
    assert_ipv6_sa(right, left, tunnel["conn"], ["fd02::/64"], ["fd01::/64"])
    crossed = ping(lab, 6)
    assert crossed.returncode == 0, crossed.stdout + crossed.stderr
    assert ping(lab, 4, count=1, wait=1).returncode != 0  # IPv4 is not among this tunnel's selectors

    shown = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert shown["live"]["child_state"] == "INSTALLED"
    assert shown["live"]["packets_out"] >= 2

    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)
    assert tunnel["conn"] not in swanctl_sas(left) + swanctl_sas(right)


async def test_dual_stack_tunnel_over_ipv6_carries_both_families_and_deletes_clean(
        client: httpx.AsyncClient, lab: Lab) -> None:
    """No selectors in the request: each end's registered inside networks, IPv6 and IPv4."""
    left, right = lab.host("left"), lab.host("right")
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert tunnel["state"] == "up"
    assert sorted(tunnel["local_ts"]) == ["10.1.0.1/32", "fd01::/64"]
    assert sorted(tunnel["remote_ts"]) == ["10.2.0.1/32", "fd02::/64"]

    assert_ipv6_sa(left, right, tunnel["conn"], ["10.1.0.1/32", "fd01::/64"], ["10.2.0.1/32", "fd02::/64"])
    assert_ipv6_sa(right, left, tunnel["conn"], ["10.2.0.1/32", "fd02::/64"], ["10.1.0.1/32", "fd01::/64"])
    for family in (6, 4):
        crossed = ping(lab, family)
        assert crossed.returncode == 0, crossed.stdout + crossed.stderr

    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)


async def _state_becomes(client: httpx.AsyncClient, tunnel_id: str, state: str, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (await client.get(f"/v1/tunnels/{tunnel_id}")).json()["state"] == state:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_ipv6_tunnel_seen_down_by_the_monitor_and_restored_by_reconcile(
        client: httpx.AsyncClient, lab: Lab) -> None:
    left, right = lab.host("left"), lab.host("right")
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right",
                                               "local_ts": ["fd01::/64"], "remote_ts": ["fd02::/64"]})
    assert r.status_code == 201, r.text
    tunnel = r.json()

    lab.stop_charon("right")  # a crash: the responder's SAs and conns are gone
    lab.start_charon("right")
    assert await _state_becomes(client, tunnel["id"], "down")
    assert ping(lab, 6, count=1, wait=1).returncode != 0

    report = (await client.post("/v1/tunnels/reconcile")).json()
    assert report["restored"] == [tunnel["id"]], report
    assert (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()["state"] == "up"
    assert_ipv6_sa(left, right, tunnel["conn"], ["fd01::/64"], ["fd02::/64"])
    assert_ipv6_sa(right, left, tunnel["conn"], ["fd02::/64"], ["fd01::/64"])
    crossed = ping(lab, 6)
    assert crossed.returncode == 0, crossed.stdout + crossed.stderr

    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)


def test_qoss_lab_up_family_6_registers_the_gateways_by_their_ipv6_addresses(tmp_path: Path) -> None:
    """``lab up`` as a user runs it (a process of its own: it leaves its charons running); ``lab down`` in
    this process (``CliRunner``: no second interpreter start-up). Its lab and database are its own."""
    lab_dir = Path(tempfile.mkdtemp(prefix="qoss-v6c-", dir="/tmp"))  # short: UNIX socket paths
    prefix = f"v6c{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}"
    db = ["--database-url", f"sqlite:///{tmp_path}/q.db"]
    runner, env = CliRunner(), {"QOSS_LAB_DIR": str(lab_dir), "QOSS_LAB_PREFIX": prefix}
    try:
        up = qoss("lab", "up", "--family", "6", *db, env=env)
        assert up.returncode == 0, up.stderr
        hosts = {h["name"]: h for h in json.loads(up.stdout)}
        assert {n: (h["ike_address"], h["inside_networks"], h["inside_address6"]) for n, h in hosts.items()} == {
            "left": ("fd00:71::1", ["fd01::/64"], "fd01::1"), "right": ("fd00:71::2", ["fd02::/64"], "fd02::1")}
        shown = subprocess.run(["ip", "-n", f"{prefix}-left", "-6", "addr", "show"], capture_output=True, text=True,
                               timeout=10, check=True).stdout
        assert "inet6 fd00:71::1/64" in shown
        assert "inet6 fd01::1/128" in shown
        assert "tentative" not in shown.split("fd00:71::1/64", 1)[1].splitlines()[0]  # nodad: usable at once
    finally:
        down = runner.invoke(cli, ["lab", "down", *db], env=env)
        shutil.rmtree(lab_dir, ignore_errors=True)
    assert down.exit_code == 0, down.output
    assert not Path("/run/netns", f"{prefix}-left").exists()


async def test_an_edit_moves_an_ipv6_tunnel_to_a_compliant_suite(client: httpx.AsyncClient, lab: Lab) -> None:
    """Re-keys work over IPv6 as over IPv4: an edit that leaves the tunnel's suite below its
    minimums moves it (make-before-break) to a compliant one, still between the IPv6 addresses."""
    left, right = lab.host("left"), lab.host("right")
    r = await client.post("/v1/tunnels", json={"initiator": "left", "responder": "right", "local_ts": ["fd01::/64"],
                                               "remote_ts": ["fd02::/64"],
                                               "min_levels": {"confidentiality": 8, "integrity": 8}})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    old_esp = tunnel["proposals"]["esp"]
    algorithm = old_esp.split("-")[0]  # the suite's cipher: weakened below the minimum
    table = await client.get("/v1/rating-tables/standards-2026")
    edited = await client.patch(f"/v1/rating-tables/standards-2026/ratings/{algorithm}",
                                json={"confidentiality": 5, "reason": "test: weakened"},
                                headers={"If-Match": table.headers["ETag"]})
    assert edited.status_code == 200, edited.text
    deadline = time.monotonic() + 15
    moved = tunnel
    while time.monotonic() < deadline and moved["proposals"]["esp"] == old_esp:
        await asyncio.sleep(0.2)
        moved = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert moved["proposals"]["esp"] != old_esp, moved
    assert moved["state"] == "up"
    assert_ipv6_sa(left, right, tunnel["conn"], ["fd01::/64"], ["fd02::/64"])
    assert_ipv6_sa(right, left, tunnel["conn"], ["fd02::/64"], ["fd01::/64"])
    crossed = ping(lab, 6)
    assert crossed.returncode == 0, crossed.stdout + crossed.stderr
    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    assert nothing_left(lab), leftovers(lab)
