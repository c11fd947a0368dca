"""One organisation's many sites, as docs/peers.md ("One organisation, many sites") sets them up:
a central qoss beside the hub gateway and a qoss beside each of two sites' gateways, each in a
network namespace of its own with its own charon (kernel-libipsec) and its own ``qoss serve``
(database, state directory, admin token), on one lab network. Each site registers the centre
and the centre each site, with the networks the table of the docs gives; one site asks for its
tunnel to the hub, the centre asks for the other's; the hub forwards, and a ping from one site's
inside address to the other's crosses both tunnels. Everything is taken down after the module,
also on failure."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.lab.hosts import Lab, LabHost
from app.lab.processes import PRIVATE_UMASK, open_private_log, private_dir, processes_with_env, stop_processes
from tests.fixtures.secrets import keep_log, register

#: The lab host, this side's peering name and its gateway's name; the centre first.
SIDES = (("centre", "centre", "hub"), ("lyon", "site-lyon", "gw-lyon"), ("oslo", "site-oslo", "gw-oslo"))
NETWORK = "10.78.0.0/24"  # no other lab uses it
PORT = 8500
#: The organisation's range: the lab's inside addresses 10.1.0.1 (centre), 10.2.0.1, 10.3.0.1 (sites).
ORGANISATION = "10.0.0.0/14"
MARK = "QOSS_LAB"


@dataclass
class Side:
    host: LabHost
    peer_name: str
    gateway: str
    home: Path
    url: str = ""
    token: str = ""
    identity: dict[str, str] = field(default_factory=dict)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, trust_env=False, timeout=60.0,
                            headers={"Authorization": f"Bearer {self.token}"})


@dataclass
class Organisation:
    root: Path
    lab: Lab
    sides: dict[str, Side] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self, side: Side) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QOSS_")}
        return {**env, MARK: str(self.root), "QOSS_DATABASE_URL": f"sqlite:///{side.home / 'qoss.db'}",
                "QOSS_STATE_DIR": str(side.home), "QOSS_PEER_NAME": side.peer_name, "QOSS_LOG_LEVEL": "warning",
                "QOSS_VICI_SOCKET_DIRS": f'["{Path(side.host.vici_socket).parent}"]',
                "XDG_CONFIG_HOME": str(side.home / "config"),
                "PYTHONPATH": os.pathsep.join(p for p in (str(Path.cwd()), os.environ.get("PYTHONPATH")) if p)}

    def down(self) -> None:
        for side in self.sides.values():
            for log in (*side.home.glob("*.log"), Path(side.host.log_path)):
                keep_log(log, f"hub-{side.host.name}-{log.name}")
                if os.environ.get("QOSS_HUB_LOGS"):  # where a failure's logs are read
                    shutil.copyfile(log, Path(os.environ["QOSS_HUB_LOGS"]) / f"{side.host.name}-{log.name}")
        victims = set(processes_with_env(MARK, self.root, exact=True))
        victims.update(p.pid for p in self.procs if p.poll() is None)
        stop_processes(sorted(victims), 10.0)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.lab.down()
        shutil.rmtree(self.root, ignore_errors=True)


def _start(org: Organisation, side: Side) -> None:
    """``qoss serve`` inside the side's namespace, and a relay from 127.0.0.1 here to it."""
    h = side.host
    with open_private_log(side.home / "serve.log") as log:
        org.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", h.netns, sys.executable, "-m", "app.cli", "serve", "--host", h.ike_address,
             "--port", str(PORT)], env=org.env(side), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=side.home, umask=PRIVATE_UMASK))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        side.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with open_private_log(side.home / "relay.log") as log:
            org.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", h.netns, sys.executable, "-m", "app.lab.relay", "--fd",
                 str(listener.fileno()), "--to", f"{h.ike_address}:{PORT}"], env=org.env(side), stdout=log,
                stderr=log, stdin=subprocess.DEVNULL, pass_fds=(listener.fileno(),), start_new_session=True,
                cwd=side.home, umask=PRIVATE_UMASK))


def _ready(org: Organisation, timeout: float = 90.0) -> None:
    pending = {s.url for s in org.sides.values()}
    deadline = time.monotonic() + timeout
    with httpx.Client(trust_env=False, timeout=2.0) as client:
        while pending:
            for proc in org.procs:
                assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
            for url in list(pending):
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{url}/healthz").status_code == 200:
                        pending.discard(url)
            assert time.monotonic() < deadline, f"{pending} did not answer within {timeout:g} s"
            if pending:
                time.sleep(0.2)


def _token(org: Organisation, side: Side) -> str:
    done = subprocess.run([sys.executable, "-m", "app.cli", "token", "create", "--name", "admin", "--scopes",
                           "admin", "--plain"], env=org.env(side), cwd=side.home, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    register(token)
    return token


def _ok(answer: httpx.Response, status: int = 200) -> Any:
    assert answer.status_code == status, f"{answer.request.method} {answer.request.url}: {answer.text}"
    return answer.json()


def _register(at: Side, other: Side, networks: list[str], min_levels: dict[str, int]) -> None:
    """``at``'s administrator registers ``other`` with the identity ``other``'s administrator sent."""
    with at.client() as c:
        _ok(c.post("/v1/peers", json={
            "name": other.peer_name, "url": f"http://{other.host.ike_address}:{PORT}", **other.identity,
            "gateways": [at.gateway], "networks": networks, "min_levels": min_levels}), 201)


@pytest.fixture(scope="module")
def organisation() -> Iterator[Organisation]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the hub-and-spokes test needs root and iproute2 (it builds network namespaces)", pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="qoss-hub-", dir="/tmp"))
    prefix = f"hs{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}"
    org = Organisation(root, Lab(root / "lab", prefix=prefix, ike_network=NETWORK))
    try:
        hosts = {h.name: h for h in org.lab.up(names=[name for name, _, _ in SIDES])}
        for name, peer_name, gateway in SIDES:
            org.sides[name] = Side(hosts[name], peer_name, gateway, private_dir(root / name))
        for side in org.sides.values():
            _start(org, side)
        _ready(org)
        for side in org.sides.values():
            side.token = _token(org, side)
            with side.client() as c:
                _ok(c.post("/v1/gateways", json={
                    "name": side.gateway, "vici_socket": side.host.vici_socket,
                    "ike_address": side.host.ike_address, "inside_networks": side.host.inside_networks}), 201)
                side.identity = {k: v for k, v in _ok(c.get("/v1/peering/identity")).items() if k != "name"}
        subprocess.run(["ip", "netns", "exec", hosts["centre"].netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                       check=True, timeout=30)
        yield org
    finally:
        org.down()


def _inside(side: Side) -> str:
    return f"{side.host.inside_address}/32"


def _installed(side: Side, tunnel_id: str) -> str:
    """What ``swanctl --list-sas`` says of the tunnel's CHILD_SA on ``side``'s own charon."""
    done = subprocess.run(["swanctl", "--list-sas", "--uri", f"unix://{side.host.vici_socket}"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout if tunnel_id in done.stdout else ""


def _ping(side: Side, to: Side) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", side.host.netns, "ping", "-c", "3", "-i", "0.3", "-W", "2", "-I",
                           side.host.inside_address, to.host.inside_address],
                          capture_output=True, text=True, timeout=60, check=False)


def test_two_sites_reach_each_other_through_the_hub(organisation: Organisation) -> None:
    centre, lyon, oslo = (organisation.sides[name] for name, _, _ in SIDES)
    floor = {"confidentiality": 5, "integrity": 5, "key_exchange": 5}
    # the centre: each site may ask for the organisation's range (the centre's network and the
    # other sites', behind the hub), one network that holds the hub's own inside address
    _register(centre, lyon, [ORGANISATION], floor)
    _register(centre, oslo, [ORGANISATION], floor)
    # each site: the centre may ask for that site's networks alone; the site's own minimums
    _register(lyon, centre, [_inside(lyon)], {"confidentiality": 6})
    _register(oslo, centre, [_inside(oslo)], {})

    with lyon.client() as c:  # asked at a site
        to_hub = _ok(c.post("/v1/tunnels", json={
            "initiator": lyon.gateway, "responder": f"{centre.gateway}@{centre.peer_name}",
            "remote_ts": [ORGANISATION]}), 201)
    with centre.client() as c:  # asked at the centre
        to_oslo = _ok(c.post("/v1/tunnels", json={
            "initiator": centre.gateway, "responder": f"{oslo.gateway}@{oslo.peer_name}",
            "local_ts": [ORGANISATION]}), 201)
    assert to_hub["state"] == "up"
    assert to_oslo["state"] == "up"
    assert to_hub["peer"]["site"] == "centre"
    assert to_oslo["peer"]["site"] == "site-oslo"

    # each side lists its own end, with its peer
    with centre.client() as c:
        at_centre = {t["id"]: t for t in _ok(c.get("/v1/tunnels"))}
    assert at_centre[to_hub["id"]]["peer"]["site"] == "site-lyon"
    assert at_centre[to_hub["id"]]["peer"]["role"] == "responder"
    assert at_centre[to_oslo["id"]]["peer"]["role"] == "initiator"
    with oslo.client() as c:
        assert [t["peer"]["site"] for t in _ok(c.get("/v1/tunnels"))] == ["centre"]
    for side, tunnel in ((lyon, to_hub), (centre, to_hub), (centre, to_oslo), (oslo, to_oslo)):
        assert "INSTALLED" in _installed(side, tunnel["id"]), (side.peer_name, tunnel["id"])

    # lyon -> centre: one tunnel; lyon -> oslo: through the hub, both tunnels
    to_centre = _ping(lyon, centre)
    assert to_centre.returncode == 0, to_centre.stdout + to_centre.stderr
    across = _ping(lyon, oslo)
    assert across.returncode == 0, across.stdout + across.stderr
    assert " 0% packet loss" in across.stdout

    # revoking a site's peering at the centre ends that site's tunnel on both sides
    with centre.client() as c:
        _ok(c.patch(f"/v1/peers/{oslo.peer_name}", json={"state": "revoked"}))
        assert [t["id"] for t in _ok(c.get("/v1/tunnels"))] == [to_hub["id"]]
    deadline = time.monotonic() + 15
    while _installed(oslo, to_oslo["id"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _installed(oslo, to_oslo["id"])
    with oslo.client() as c:
        assert _ok(c.get("/v1/tunnels")) == []
    assert _ping(lyon, oslo).returncode != 0
