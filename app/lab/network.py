"""A lab's network: a network namespace per host, joined by a veth pair (two hosts) or through
a bridge in a hub namespace (more), each host with its IKE address on :data:`IKE_INTERFACE`
and its "inside" /32 on ``lo``; with IPv6, also an IPv6 IKE address and an inside /128 beside them
(:func:`add_addresses6`). Nothing in the root namespace is touched. Needs iproute2."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.lab.processes import run_command

__all__ = ["IKE_INTERFACE", "add_addresses", "add_addresses6", "add_namespace", "delete_namespace", "join_by_bridge",
           "join_pair", "netns_exists"]

#: The interface IKE and ESP-in-UDP travel on between lab hosts (inside addresses live on ``lo``).
IKE_INTERFACE = "ike0"
_IKE_IF = IKE_INTERFACE


def netns_exists(name: str) -> bool:
    """Whether the network namespace ``name`` exists."""
    return Path("/run/netns", name).exists()


def add_namespace(netns: str) -> None:
    """A new network namespace with its loopback up."""
    run_command("ip", "netns", "add", netns)
    run_command("ip", "-n", netns, "link", "set", "lo", "up")


def join_pair(left: str, right: str) -> None:
    """Two namespaces joined by a veth pair created directly inside them."""
    run_command("ip", "link", "add", _IKE_IF, "netns", left, "type", "veth",
                "peer", "name", _IKE_IF, "netns", right)


def join_by_bridge(hub: str, namespaces: Sequence[str]) -> None:
    """Each namespace joined by a veth pair to the bridge ``br0`` in ``hub``."""
    run_command("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
    run_command("ip", "-n", hub, "link", "set", "br0", "up")
    for i, netns in enumerate(namespaces):
        port = f"p{i}"
        run_command("ip", "link", "add", port, "netns", hub, "type", "veth",
                    "peer", "name", _IKE_IF, "netns", netns)
        run_command("ip", "-n", hub, "link", "set", port, "master", "br0")
        run_command("ip", "-n", hub, "link", "set", port, "up")


def add_addresses(netns: str, ike_address: str, inside_address: str) -> None:
    """The IKE address (``address/prefix``) on :data:`IKE_INTERFACE`, brought up; ``inside_address``/32 on ``lo``."""
    run_command("ip", "-n", netns, "addr", "add", ike_address, "dev", _IKE_IF)
    run_command("ip", "-n", netns, "link", "set", _IKE_IF, "up")
    run_command("ip", "-n", netns, "addr", "add", f"{inside_address}/32", "dev", "lo")


def add_addresses6(netns: str, ike_address: str, inside_address: str) -> None:
    """IPv6 beside IPv4 (after :func:`add_addresses`): IPv6 switched on in ``netns``, the IKE
    address (``address/prefix``) on :data:`IKE_INTERFACE` and ``inside_address``/128 on ``lo``.
    Both are ``nodad``: usable at once, not tentative for the second or two duplicate address
    detection takes."""
    run_command("ip", "netns", "exec", netns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=0",
                "net.ipv6.conf.default.disable_ipv6=0")
    run_command("ip", "-n", netns, "-6", "addr", "add", ike_address, "dev", _IKE_IF, "nodad")
    run_command("ip", "-n", netns, "-6", "addr", "add", f"{inside_address}/128", "dev", "lo", "nodad")


def delete_namespace(netns: str) -> str | None:
    """Delete ``netns`` if it exists; what went wrong if it is still there."""
    if not netns_exists(netns):
        return None
    done = run_command("ip", "netns", "delete", netns, check=False)
    if done.returncode != 0 and netns_exists(netns):
        return f"{netns}: {done.stderr.strip()}"
    return None
