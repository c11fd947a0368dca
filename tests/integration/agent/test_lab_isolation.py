"""What the agent lab leaves open: nothing. ``qoss lab up --agent`` under a prefix of its own.

Target's protected address answers only through a tunnel: from the lab's ``device`` namespace,
with no tunnel and a route to it added by hand, it stays silent (the packets are dropped in
Target's namespace, counted by its guard chain); a stock client that joined reaches it, and once
the device is revoked the same route by hand reaches nothing again. Every file the lab and the
processes it started wrote (databases with their ``-wal``/``-shm``, logs, configs, the lab's own
records, the charons' files, every key pair) is its owner's alone: 0600 in 0700 directories (the
device CA's public certificates stay 0644 behind them; charon's VICI sockets are its own 0770)."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.lab.network import GUARD_CHAIN
from tests.fixtures.stock_client import CharonCmd
from tests.integration.agent.test_device_join import (
    LabCli,
    agent_lab,
    enrol,
    ping,
    ping6,
    stock_profile,
    wait_for,
)

pytestmark = pytest.mark.charon


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[LabCli, dict[str, Any]]]:
    with agent_lab("qi") as made:
        yield made


@pytest.fixture(scope="module")
def ipv6_lab() -> Iterator[tuple[LabCli, dict[str, Any]]]:
    with agent_lab("qi6", "--family", "6") as made:
        yield made


def route_by_hand(netns: str, address: str, via: str) -> None:
    prefix = 128 if ":" in address else 32
    subprocess.run(["ip", "-n", netns, "route", "replace", f"{address}/{prefix}", "via", via], check=True, timeout=10)


def dropped(target_netns: str, tool: str = "iptables") -> int:
    """Packets Target's guard chain (``tool``: iptables or ip6tables) has dropped so far."""
    listed = subprocess.run(["ip", "netns", "exec", target_netns, tool, "-w", "-L", GUARD_CHAIN, "-v", "-n", "-x"],
                            capture_output=True, text=True, check=True, timeout=10).stdout
    return sum(int(line.split()[0]) for line in listed.splitlines() if " DROP " in f" {line} ")


def test_the_protected_address_does_not_answer_without_a_tunnel_even_with_a_route_by_hand(
        lab: tuple[LabCli, dict[str, Any]]) -> None:
    _, up = lab
    device, target = up["device"]["netns"], up["target"]
    inside = target["protected"][0].split("/")[0]
    route_by_hand(device, inside, target["ike_address"])
    try:
        before = dropped(target["netns"])
        assert not ping(device, inside)
        assert dropped(target["netns"]) > before  # it arrived and was dropped, not lost on the way
    finally:
        subprocess.run(["ip", "-n", device, "route", "del", f"{inside}/32"], check=False, timeout=10)


def test_over_ipv6_the_protected_network_does_not_answer_without_a_tunnel_either(
        ipv6_lab: tuple[LabCli, dict[str, Any]]) -> None:
    _, up = ipv6_lab
    device, target = up["device"]["netns"], up["target"]
    inside = "fd03::1"
    assert target["protected"] == ["fd03::/64"]
    route_by_hand(device, inside, target["ike_address"])
    try:
        before = dropped(target["netns"], "ip6tables")
        assert not ping6(device, inside)
        assert dropped(target["netns"], "ip6tables") > before
    finally:
        subprocess.run(["ip", "-n", device, "-6", "route", "del", f"{inside}/128"], check=False, timeout=10)


def test_a_revoked_device_reaches_nothing_even_with_a_route_by_hand(lab: tuple[LabCli, dict[str, Any]],
                                                                    tmp_path: Path) -> None:
    cli, up = lab
    device, target = up["device"]["netns"], up["target"]
    inside = target["protected"][0].split("/")[0]
    report = enrol(cli, "erin", "android", tmp_path / "out", "--confidentiality", "8", "--integrity", "8")
    profile = stock_profile(report, tmp_path / "device")
    with CharonCmd(device, tmp_path / "joined", profile, limit=60) as joined:
        joined.type_passphrase()
        assert wait_for(lambda: ping(device, inside), 15, 0.2), joined.log()[-3000:]  # through the tunnel
        cli.run("device", "erin", "--revoke")
        assert wait_for(lambda: not joined.alive() or joined.virtual_ip() is None, 10.0), joined.log()[-2000:]
    route_by_hand(device, inside, target["ike_address"])
    try:
        before = dropped(target["netns"])
        assert not ping(device, inside)
        assert dropped(target["netns"]) > before
    finally:
        subprocess.run(["ip", "-n", device, "route", "del", f"{inside}/32"], check=False, timeout=10)


def test_the_labs_state_is_its_owners_alone(lab: tuple[LabCli, dict[str, Any]], tmp_path: Path) -> None:
    cli, _ = lab
    enrol(cli, "fay", "apple", tmp_path / "out")  # Host's database holds an enrolment and its records now
    state = cli.root / "lab" / "agent"
    names = {p.name for p in state.iterdir()}
    assert {"host.db", "target.db", "host.log", "target.log", "host.yaml", "target.yaml", "agent.json"} <= names
    assert any(n.endswith("-wal") for n in names), names  # the servers' SQLite journals are checked too
    loose = []
    for path in [state, *state.rglob("*")]:
        st = path.lstat()
        if stat.S_ISSOCK(st.st_mode):  # charon makes its VICI socket 0770 itself: its directory keeps others out
            assert stat.S_IMODE(path.parent.lstat().st_mode) == 0o700, path
            continue
        allowed = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if path.suffix == ".crt":  # the device CA's public certificates, 0644 by design, behind a 0700 directory
            assert stat.S_IMODE(path.parent.lstat().st_mode) == 0o700, path
            allowed = 0o644
        if stat.S_IMODE(st.st_mode) & ~allowed:
            loose.append(f"{path.relative_to(state)} {stat.S_IMODE(st.st_mode):o}")
    assert not loose, loose
