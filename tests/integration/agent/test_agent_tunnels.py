"""A mobile user gets a real tunnel through Host and Target, and loses it again."""

from __future__ import annotations

import ipaddress
import subprocess

import pytest

from tests.integration.agent.conftest import POOL, AgentEnv

pytestmark = pytest.mark.charon


def ping(env: AgentEnv, source: str) -> subprocess.CompletedProcess[str]:
    left, right = env.lab.host("left"), env.lab.host("right")
    return subprocess.run(
        ["ip", "netns", "exec", left.netns, "ping", "-c", "2", "-W", "1", "-I", source, right.inside_address],
        capture_output=True, text=True, timeout=15, check=False,
    )


def test_connect_ping_disconnect(agent_env: AgentEnv) -> None:
    agent_env.enroll("alice", [2, 3, 4])
    client = agent_env.client("alice")
    report = client.connect(target="hq", objective_id=3, min_levels={"confidentiality": 5, "integrity": 5})
    try:
        assert report["protection"] == "esp"
        vip = report["virtual_ip"]
        assert vip is not None
        assert ipaddress.ip_address(vip) in ipaddress.ip_network(POOL)
        done = ping(agent_env, vip)
        assert done.returncode == 0, done.stdout + done.stderr
        sas = agent_env.target_vici.list_sas(ike=report["conn"])
        assert len(sas) == 1
        assert sas[0].state == "ESTABLISHED"
        assert sas[0].remote_vips == (vip,)
    finally:
        closed = client.disconnect(report["ticket"])
    assert closed == [report["ticket"]]
    assert agent_env.target_config_empty()
    assert report["conn"] not in agent_env.client_vici.list_conns()
    assert client.tunnels() == []
