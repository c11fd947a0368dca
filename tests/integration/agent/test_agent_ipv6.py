"""The tunnel agent over IPv6: a client joins Target over IPv6 and gets its tunnel.

One lab per module with IPv6 beside IPv4 (``lab6`` of tests/integration/conftest.py, the one
tests/integration/tunnels/test_ipv6.py uses too): the client's charon is ``left``
(``fd00:71::1``), Target's is ``right`` (``fd00:71::2``). Host and Target are one real uvicorn on
``[::1]`` (the agent conftest's ``running_agent``, as for the IPv4 agent tests), so the agent's
messages travel over IPv6 too, in one of two set-ups (one server at a time): ``ipv6``, Target
protecting ``fd02::/64`` with an IPv6 pool; ``dual``, Target protecting ``10.2.0.1/32`` and
``fd02::/64`` with a dual pool (an IPv4 and an IPv6 virtual IP per client). A join is checked
with ``swanctl --list-sas`` on both charons, a ping of each family from the virtual IPs to
Target's inside addresses, and nothing left on either charon once the user disconnects.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Iterator

import pytest

from app.lab.hosts import Lab, LabHost
from tests.integration.agent.conftest import AgentEnv, running_agent, server_config

pytestmark = pytest.mark.charon

POOL4, POOL6 = "10.8.0.0/28", "fd08::/124"
#: Per set-up: what Target protects, its pool, its pool6.
SETUPS: dict[str, tuple[list[str], str, str | None]] = {
    "ipv6": (["fd02::/64"], POOL6, None),
    "dual": (["10.2.0.1/32", "fd02::/64"], POOL4, POOL6),
}


@pytest.fixture(scope="module")
def env6(request: pytest.FixtureRequest, lab6: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentEnv]:
    """Host and Target on ``[::1]`` in the set-up named by the test's parameter (see :data:`SETUPS`),
    over the shared IPv6 lab (``lab6``, tests/integration/conftest.py): Target on ``right``'s IPv6 IKE
    address, the client on ``left``'s."""
    protected, pool, pool6 = SETUPS[request.param]
    dir = tmp_path_factory.mktemp(f"agent6-{request.param}")
    config = server_config(dir, lab6, protected=protected, pool=pool, pool6=pool6)
    with running_agent(lab6, dir, config, host="::1") as env:
        yield env


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
def test_join_over_ipv6_gets_an_ipv6_tunnel_ping6_crosses_disconnect_leaves_nothing(env6: AgentEnv) -> None:
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
def test_join_to_a_dual_pool_gets_a_virtual_ip_of_each_family_and_both_pings_cross(env6: AgentEnv) -> None:
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
