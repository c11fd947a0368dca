"""The tunnel agent over IPv6: a client joins Target over IPv6 and gets its tunnel.

One lab per module with IPv6 beside IPv4 (``families=(6, 4)``): the client's charon is
``left`` (``fd00:71::1``), Target's is ``right`` (``fd00:71::2``). Host and Target are one real
uvicorn on ``[::1]``, so the agent's messages travel over IPv6 too, in one of two set-ups
(one server at a time): ``ipv6``, Target protecting ``fd02::/64`` with an IPv6 pool; ``dual``,
Target protecting ``10.2.0.1/32`` and ``fd02::/64`` with a dual pool (an IPv4 and an IPv6
virtual IP per client). A join is checked with ``swanctl --list-sas`` on both charons, a ping
of each family from the virtual IPs to Target's inside addresses, and nothing left on either
charon once the user disconnects.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from app.adapters.agent.crypto import CRYPTO, KeyPair, load_keys, write_keys
from app.adapters.agent.transport import post_message
from app.bootstrap import prepare_database
from app.lab import agent_configs
from app.lab.hosts import Lab, LabHost
from app.main import create_app
from app.services.agent_client import AgentClient
from app.services.agent_config import load_client_config
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import register_keys
from tests.fixtures.secrets import keep_log
from tests.integration.agent.conftest import RegisteringVici

pytestmark = pytest.mark.charon

POOL4, POOL6 = "10.8.0.0/28", "fd08::/124"
#: Per set-up: what Target protects, its pool, its pool6.
SETUPS: dict[str, tuple[list[str], str, str | None]] = {
    "ipv6": (["fd02::/64"], POOL6, None),
    "dual": (["10.2.0.1/32", "fd02::/64"], POOL4, POOL6),
}


@dataclass
class Env6:
    lab: Lab
    dir: Path
    url: str
    admin: dict[str, str]

    def enroll(self, user: str, objectives: list[int]) -> None:
        keys = KeyPair.generate(user)
        register_keys(keys)
        write_keys(keys, self.dir / "keys", overwrite=True)
        r = httpx.post(f"{self.url}/v1/agent/users", headers=self.admin, timeout=10, json={
            "user_id": user, "objectives": objectives, **keys.public.as_dict()})
        assert r.status_code == 201, r.text

    def client(self, user: str) -> AgentClient:
        """The user's agent, reaching Target from the client's IPv6 IKE address."""
        left, pub = self.lab.host("left"), self.dir / "keys" / "hq.pub.json"
        assert left.ike_address6 is not None
        path = agent_configs.write_config(self.dir / f"client-{user}.yaml", agent_configs.client_config(
            user=user, key_dir=self.dir / "keys", host_id="hq", host_url=self.url, host_key=pub,
            targets={"hq": pub}, vici_socket=left.vici_socket, state_dir=self.dir / f"state-{user}",
            ike_address=left.ike_address6), client=True)
        config = load_client_config(path)
        return AgentClient(config=config, keys=load_keys(config.key_dir, user), crypto=CRYPTO,
                           vici=RegisteringVici(config.vici_socket, timeout=20.0), post=post_message)


def _free_port() -> int:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def lab6() -> Iterator[Lab]:
    """Two charons, IKE over IPv6, inside addresses of both families; always taken down."""
    state = Path(tempfile.mkdtemp(prefix="qoss-v6a-", dir="/tmp"))
    lab = Lab(state, prefix=f"v6a{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}", families=(6, 4))
    hosts: list[LabHost] = []
    try:
        hosts = lab.up()
        yield lab
    finally:
        try:
            lab.down()
        finally:
            for host in hosts:
                keep_log(host.log_path, f"charon-v6a-{host.name}.log")
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def env6(request: pytest.FixtureRequest, lab6: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env6]:
    """Host and Target on ``[::1]`` in the set-up named by the test's parameter (see :data:`SETUPS`)."""
    protected, pool, pool6 = SETUPS[request.param]
    right = lab6.host("right")
    assert right.ike_address6 is not None
    dir = tmp_path_factory.mktemp(f"agent6-{request.param}")
    server_keys = KeyPair.generate("hq")
    register_keys(server_keys)
    write_keys(server_keys, dir / "keys")
    pub = dir / "keys" / "hq.pub.json"
    role = agent_configs.target_role(hosts={"hq": pub}, vici_socket=right.vici_socket,
                                     ike_address=right.ike_address6, protected=protected, pool=pool,
                                     sweep_interval=0.2)
    if pool6 is not None:
        role["pool6"] = pool6
    config = agent_configs.write_config(dir / "agent.yaml", agent_configs.server_config(
        id="hq", key_dir=dir / "keys", host=agent_configs.host_role({"hq": ("local", pub)}), target=role))
    settings = Settings(database_url=f"sqlite:///{dir}/qoss.db", vici_socket_dirs=[lab6.state_dir],
                        reconcile_on_start=False, agent_config=config)
    prepare_database(settings)
    admin = {"Authorization": f"Bearer {make_token(settings.database_url, 'agent6-admin', ['admin'])}"}
    port = _free_port()
    app = create_app(settings, vici_factory=lambda p: RegisteringVici(p, 15.0))
    server = uvicorn.Server(uvicorn.Config(app, host="::1", port=port, log_level="warning", http="httptools"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert server.started
        yield Env6(lab6, dir, f"http://[::1]:{port}", admin)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def swanctl_sas(host: LabHost) -> str:
    done = subprocess.run(["swanctl", "--list-sas", "--uri", f"unix://{host.vici_socket}"],
                          capture_output=True, text=True, timeout=15, check=True)
    return done.stdout


def assert_ipv6_sa(host: LabHost, peer: LabHost, conn: str, local_ts: set[str], remote_ts: set[str]) -> None:
    """``swanctl --list-sas`` on ``host``: conn's IKE_SA between the IPv6 IKE addresses, its ESP
    CHILD_SA installed with these selectors (in any order)."""
    text = swanctl_sas(host)
    assert re.search(rf"^{re.escape(conn)}: #\d+, ESTABLISHED, IKEv2", text, re.M), text
    assert re.search(rf"^\s+local\s+'[^']*' @ {re.escape(host.ike_address6 or '-')}\[\d+\]", text, re.M), text
    assert re.search(rf"^\s+remote\s+'[^']*' @ {re.escape(peer.ike_address6 or '-')}\[\d+\]", text, re.M), text
    assert re.search(rf"^\s+{re.escape(conn)}: #\d+, reqid \d+, INSTALLED, TUNNEL(-in-UDP)?, ESP:", text, re.M), text
    selectors = dict(re.findall(r"^\s{4}(local|remote)\s+([0-9a-f.:/ ]+)$", text, re.M))
    assert set(selectors.get("local", "").split()) == local_ts, text
    assert set(selectors.get("remote", "").split()) == remote_ts, text


def ping(lab: Lab, source: str, target: str) -> subprocess.CompletedProcess[str]:
    """From the client's namespace, sourced at ``source``."""
    family = 6 if ":" in target else 4
    return subprocess.run(["ip", "netns", "exec", lab.host("left").netns, "ping", f"-{family}", "-c", "2",
                           "-i", "0.2", "-W", "2", "-I", source, target],
                          capture_output=True, text=True, timeout=15, check=False)


def nothing_left(lab: Lab) -> dict[str, object]:
    """What either charon still holds (empty: nothing)."""
    out: dict[str, object] = {}
    for host in lab.hosts:
        g = host.gateway(timeout=5.0)
        held = {"conns": g.list_conns(), "shared": g.get_shared(), "sas": [s.name for s in g.list_sas()],
                "pools": [p.name for p in g.get_pools()]}
        if any(held.values()):
            out[host.name] = held
    return out


@pytest.mark.parametrize("env6", ["ipv6"], indirect=True)
def test_join_over_ipv6_gets_an_ipv6_tunnel_ping6_crosses_disconnect_leaves_nothing(env6: Env6) -> None:
    left, right = env6.lab.host("left"), env6.lab.host("right")
    env6.enroll("alice6", [3])
    client = env6.client("alice6")
    report = client.connect(target="hq", objective_id=3, min_levels={"confidentiality": 5, "integrity": 5})
    try:
        assert report["protection"] == "esp"
        vip = report["virtual_ip"]
        assert vip is not None, report
        assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL6), report
        conn = report["conn"]

        assert_ipv6_sa(left, right, conn, {f"{vip}/128"}, {"fd02::/64"})
        assert_ipv6_sa(right, left, conn, {"fd02::/64"}, {f"{vip}/128"})
        crossed = ping(env6.lab, vip, right.inside_address6 or "-")
        assert crossed.returncode == 0, crossed.stdout + crossed.stderr
    finally:
        closed = client.disconnect(report["ticket"])
    assert closed == [report["ticket"]]
    assert client.tunnels() == []
    assert nothing_left(env6.lab) == {}


@pytest.mark.parametrize("env6", ["dual"], indirect=True)
def test_join_to_a_dual_pool_gets_a_virtual_ip_of_each_family_and_both_pings_cross(env6: Env6) -> None:
    left, right = env6.lab.host("left"), env6.lab.host("right")
    env6.enroll("dana6", [3])
    client = env6.client("dana6")
    report = client.connect(target="hq", objective_id=3)
    try:
        assert report["protection"] == "esp"
        conn = report["conn"]
        (sa,) = left.gateway(timeout=5.0).list_sas(ike=conn)
        vips = {ipaddress.ip_address(v).version: v for v in sa.local_vips}
        assert set(vips) == {4, 6}, sa.local_vips
        vip4, vip6 = vips[4], vips[6]
        assert ipaddress.ip_address(vip4) in ipaddress.ip_network(POOL4)
        offset = int(ipaddress.ip_address(vip4)) - int(ipaddress.ip_network(POOL4).network_address)
        assert vip6 == str(ipaddress.ip_network(POOL6).network_address + offset)  # the same offset
        assert report["virtual_ip"] in (vip4, vip6)

        mine = {f"{vip4}/32", f"{vip6}/128"}
        assert_ipv6_sa(left, right, conn, mine, {"10.2.0.1/32", "fd02::/64"})
        assert_ipv6_sa(right, left, conn, {"10.2.0.1/32", "fd02::/64"}, mine)
        for source, target in ((vip6, right.inside_address6 or "-"), (vip4, right.inside_address)):
            crossed = ping(env6.lab, source, target)
            assert crossed.returncode == 0, crossed.stdout + crossed.stderr
    finally:
        closed = client.disconnect(report["ticket"])
    assert closed == [report["ticket"]]
    assert nothing_left(env6.lab) == {}
