"""End to end in three namespaces: ``qoss agent connect`` in the client's namespace gets a real
tunnel from Target through Host (each its own ``qoss serve``), pings through it from its virtual IP,
and ``qoss agent disconnect`` leaves nothing on Target."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from app.adapters.vici.driver import ViciGateway
from tests.fixtures.secrets import keep_log
from tests.integration.agent.topology import POOL, Topology

pytestmark = pytest.mark.charon


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    topo = Topology()
    try:
        yield topo.open()
    finally:
        for log in list(topo.dir.glob("*.log")) + [topo.dir / "lab" / n / "charon.log" for n in ("client", "target")]:
            if log.exists():
                keep_log(log, f"agent-e2e-{log.parent.name}-{log.name}")
        topo.close()


def agent_conns(v: ViciGateway) -> tuple[list[str], list[str], list[str]]:
    return ([c for c in v.list_conns() if c.startswith("qoss-agent-")],
            [s for s in v.get_shared() if s.startswith("qoss-agent-")],
            [p.name for p in v.get_pools() if p.name.startswith("qoss-agent-")])


def test_connect_ping_disconnect_across_three_namespaces(topo: Topology) -> None:
    target, client = topo.target.gateway(5.0), topo.client.gateway(5.0)
    report = topo.agent("connect", "--target", "target-1", "--objective", "3", "--confidentiality", "6",
                        "--integrity", "6")
    assert report["protection"] == "esp"
    vip = report["virtual_ip"]
    assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL)
    ping = subprocess.run(["ip", "netns", "exec", topo.client.netns, "ping", "-c", "2", "-W", "1", "-I", vip,
                           topo.target.inside_address], capture_output=True, text=True, timeout=15, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    suite = report["suite"]
    for v in (target, client):
        sa = v.list_sas(ike=report["conn"])[0]
        child = sa.children[0]
        assert sa.state == "ESTABLISHED"
        assert child.state == "INSTALLED"
        assert child.protocol == "ESP"
        encr = suite["encryption"]
        assert child.encr_alg is not None
        assert child.encr_alg.lower().replace("_", "").startswith(encr[:3])
    status = topo.agent("status")
    assert [t["ticket"] for t in status] == [report["ticket"]]
    assert status[0]["in_charon"] is True
    closed = topo.agent("disconnect")
    assert closed == {"closed": [report["ticket"]]}
    assert agent_conns(target) == ([], [], [])
    assert agent_conns(client)[:2] == ([], [])
    assert topo.agent("status") == []


def test_unknown_objective_is_refused_uniformly(topo: Topology) -> None:
    done = topo.agent("connect", "--target", "target-1", "--objective", "4", check=False)
    assert done.returncode == 2
    assert "AgentRejected" in done.stderr
    assert "the request was rejected" in done.stderr
    assert agent_conns(topo.target.gateway(5.0)) == ([], [], [])


def test_after_a_revoke_status_tells_the_truth_and_cleans_up(topo: Topology) -> None:
    """Host revokes alice: Target takes her tunnel down, so her charon loses the SA. ``agent status``
    then says so (not a loaded conn taken for a tunnel), unloads what is left, and forgets it.
    Runs last: alice stays revoked."""
    client = topo.client.gateway(5.0)
    report = topo.agent("connect", "--target", "target-1", "--objective", "3", "--confidentiality", "6")
    assert [t["in_charon"] for t in topo.agent("status")] == [True]
    token = topo.qoss("token", "create", "--name", "revoker", "--scopes", "agent:enroll", "--plain",
                      "--database-url", topo.db("host")).stdout.strip()
    revoke = ("import httpx, sys; r = httpx.delete(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]},"
              " timeout=30); print(r.status_code, r.text)")
    done = subprocess.run(["ip", "netns", "exec", topo.client.netns, sys.executable, "-c", revoke,
                           f"{topo.url(topo.host)}/v1/agent/users/alice", token],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.startswith("200"), done.stdout + done.stderr
    deadline = time.monotonic() + 20  # Target's DELETE reaches the client's charon
    while client.list_sas(ike=report["conn"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.list_sas(ike=report["conn"]) == []
    (entry,) = topo.agent("status")
    assert entry["ticket"] == report["ticket"]
    assert entry["in_charon"] is False
    assert "closed by the target" in entry["closed"]
    assert agent_conns(client)[:2] == ([], [])
    assert topo.agent("status") == []
