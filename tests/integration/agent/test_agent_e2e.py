"""End to end in three namespaces: ``qoss agent connect`` in the client's namespace gets a real
tunnel from Target through Host (each its own ``qoss serve``), pings through it from its virtual IP,
and ``qoss agent disconnect`` leaves nothing on Target. The lab is ``app.lab.agent``'s,
as ``qoss lab up --agent`` builds it; every test runs with the fast paths on and off (QOSS_FAST_PATHS)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.adapters.agent.crypto import load_keys
from app.adapters.vici.gateway import ViciGateway
from app.lab.agent import HOST_ID, POOL, TARGET_ID, AgentLab
from app.lab.agent_users import enroll
from tests.fixtures.agent_roles import register_keys
from tests.fixtures.secrets import keep_log

pytestmark = pytest.mark.charon


@pytest.fixture(scope="module", params=["fast-paths-on", "fast-paths-off"])
def lab(request: pytest.FixtureRequest) -> Iterator[AgentLab]:
    """The lab, once with QOSS_FAST_PATHS on (servers and client) and once off: both paths stay correct."""
    env = {"QOSS_FAST_PATHS": "true" if request.param == "fast-paths-on" else "false"}
    with AgentLab.temporary("qe", server_env=env, client_env=env) as lab:
        try:
            enroll(lab, "alice", objectives=(3, 2))
            for name in (HOST_ID, TARGET_ID, "alice"):  # the leak sweep looks for them in every log kept
                register_keys(load_keys(lab.key_dir, name))
            yield lab
        finally:
            logs = [lab.state_dir / f"{role}.log" for role in lab.roles]
            for log in logs + [Path(lab.host(n).log_path) for n in ("client", "target")]:
                if log.exists():
                    keep_log(log, f"agent-e2e-{request.param}-{log.parent.name}-{log.name}")


def agent(lab: AgentLab, *args: str, check: bool = True) -> Any:
    """``qoss agent ARGS`` as alice in the client's namespace: its JSON, or the finished process if it failed."""
    done = lab.agent("alice", *args, check=False)
    if check:
        assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.returncode == 0 else done


def agent_conns(v: ViciGateway) -> tuple[list[str], list[str], list[str]]:
    return ([c for c in v.list_conns() if c.startswith("qoss-agent-")],
            [s for s in v.get_shared() if s.startswith("qoss-agent-")],
            [p.name for p in v.get_pools() if p.name.startswith("qoss-agent-")])


def test_connect_ping_disconnect_across_three_namespaces(lab: AgentLab) -> None:
    target, client = lab.host("target").gateway(5.0), lab.host("client").gateway(5.0)
    report = agent(lab, "connect", "--target", "target-1", "--objective", "3", "--confidentiality", "6",
                   "--integrity", "6")
    assert report["protection"] == "esp"
    vip = report["virtual_ip"]
    assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL)
    ping = subprocess.run(["ip", "netns", "exec", lab.host("client").netns, "ping", "-c", "2", "-W", "1", "-I", vip,
                           lab.host("target").inside_address],
                          capture_output=True, text=True, timeout=15, check=False)
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
    status = agent(lab, "status")
    assert [t["ticket"] for t in status] == [report["ticket"]]
    assert status[0]["in_charon"] is True
    closed = agent(lab, "disconnect")
    assert closed == {"closed": [report["ticket"]]}
    assert agent_conns(target) == ([], [], [])
    assert agent_conns(client)[:2] == ([], [])
    assert agent(lab, "status") == []


def test_unknown_objective_is_refused_uniformly(lab: AgentLab) -> None:
    done = agent(lab, "connect", "--target", "target-1", "--objective", "4", check=False)
    assert done.returncode == 2
    assert "AgentRejected" in done.stderr
    assert "the request was rejected" in done.stderr
    assert agent_conns(lab.host("target").gateway(5.0)) == ([], [], [])


def test_after_a_revoke_status_tells_the_truth_and_cleans_up(lab: AgentLab) -> None:
    """Host revokes alice: Target takes her tunnel down, so her charon loses the SA. ``agent status``
    then says so (not a loaded conn taken for a tunnel), unloads what is left, and forgets it.
    Runs last: alice stays revoked."""
    client = lab.host("client").gateway(5.0)
    report = agent(lab, "connect", "--target", "target-1", "--objective", "3", "--confidentiality", "6")
    assert [t["in_charon"] for t in agent(lab, "status")] == [True]
    token = lab.qoss("token", "create", "--name", "revoker", "--scopes", "agent:enroll", "--plain",
                     "--database-url", lab.database_url("host")).stdout.strip()
    revoke = ("import httpx, sys; r = httpx.delete(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]},"
              " timeout=30); print(r.status_code, r.text)")
    done = subprocess.run(["ip", "netns", "exec", lab.host("client").netns, sys.executable, "-c", revoke,
                           f"{lab.url('host')}/v1/agent/users/alice", token],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.startswith("200"), done.stdout + done.stderr
    deadline = time.monotonic() + 20  # Target's DELETE reaches the client's charon
    while client.list_sas(ike=report["conn"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.list_sas(ike=report["conn"]) == []
    (entry,) = agent(lab, "status")
    assert entry["ticket"] == report["ticket"]
    assert entry["in_charon"] is False
    assert "closed by the target" in entry["closed"]
    assert agent_conns(client)[:2] == ([], [])
    assert agent(lab, "status") == []
