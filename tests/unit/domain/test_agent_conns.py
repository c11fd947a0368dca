"""The client's conn asks for a virtual IP of each address family it reaches through Target."""

from __future__ import annotations

import pytest

from app.domain.agent.conns import client_conn, virtual_ip_requests
from app.domain.agent.parts import TunnelingInfo

ANY4 = "0.0.0.0"  # noqa: S104 - a virtual IP request ("any IPv4 address"), nothing binds to it


def _info(remote_ts: tuple[str, ...]) -> TunnelingInfo:
    return TunnelingInfo(
        ticket="0" * 32, protection="esp", target_address="fd00:71::2", target_identity="target-1",
        client_identity="alice@target-1", remote_ts=remote_ts, ike_proposal="aes128-sha256-modp2048",
        esp_proposal="aes128gcm16", mode="tunnel", suite={}, notes=(), expires=0)


@pytest.mark.parametrize(("remote_ts", "vips"), [
    (["10.2.0.1/32"], [ANY4]),
    (["fd02::/64"], ["::"]),
    (["fd02::/64", "10.2.0.1/32"], [ANY4, "::"]),
    (["10.2.0.0/24", "10.3.0.0/24"], [ANY4]),
    ([], [ANY4]),
])
def test_virtual_ip_requests_follow_the_families_reached(remote_ts: list[str], vips: list[str]) -> None:
    assert virtual_ip_requests(remote_ts) == vips


def test_client_conn_to_an_ipv6_target_asks_for_an_ipv6_virtual_ip() -> None:
    conn = client_conn(name="qoss-agent-x", info=_info(("fd02::/64",)), client_address="fd00:71::1")
    assert conn["vips"] == ["::"]
    assert conn["remote_addrs"] == ["fd00:71::2"]
    assert conn["local_addrs"] == ["fd00:71::1"]
    assert conn["children"]["qoss-agent-x"]["remote_ts"] == ["fd02::/64"]


def test_client_conn_to_a_dual_stack_target_asks_for_both() -> None:
    conn = client_conn(name="qoss-agent-x", info=_info(("10.2.0.1/32", "fd02::/64")), client_address=None)
    assert conn["vips"] == [ANY4, "::"]
    assert "local_addrs" not in conn
