"""A lab's network: a network namespace per host, joined by a veth pair (two hosts) or through
a bridge in a hub namespace (more), each host with its IKE address on :data:`IKE_INTERFACE`
and its "inside" /32 on ``lo``; with IPv6, also an IPv6 IKE address and an inside /128 beside them
(:func:`add_addresses6`). A host's protected networks can be closed to everything but its
tunnels (:func:`guard_inside`). Nothing in the root namespace is touched. Needs iproute2 (and
iptables for :func:`guard_inside`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

from app.lab.processes import run_command

__all__ = ["GUARD_CHAIN", "IKE_INTERFACE", "TUNNEL_INTERFACE", "add_addresses", "add_addresses6", "add_namespace",
           "delete_namespace", "guard_inside", "join_by_bridge", "join_pair", "netns_exists"]

#: The interface IKE and ESP-in-UDP travel on between lab hosts (inside addresses live on ``lo``).
IKE_INTERFACE = "ike0"
_IKE_IF = IKE_INTERFACE
#: The TUN device kernel-libipsec hands decrypted packets to (and takes packets to encrypt from).
TUNNEL_INTERFACE = "ipsec0"
#: The chain (in ``INPUT`` and ``FORWARD``, IPv4 and IPv6) that keeps protected networks for tunnels.
GUARD_CHAIN = "qoss-inside"


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


def guard_inside(netns: str, networks: Sequence[str], *, tunnel_interface: str = TUNNEL_INTERFACE) -> None:
    """Let only tunnel traffic reach ``networks`` in ``netns``: a packet to one of them, delivered
    to the host (``INPUT``) or routed through it (``FORWARD``), passes if it came out of a tunnel
    (in on ``tunnel_interface``, where kernel-libipsec delivers what it decrypted, or matched by
    the kernel's inbound IPsec policy) or from the host itself (``lo``); anything else is dropped,
    whatever route its sender added by hand. iptables and ip6tables, chain :data:`GUARD_CHAIN`.

    Raises:
        LabError: a rule could not be added (the message is iptables' stderr).
        ValueError: a network is not an IP network.
    """
    nets = [ipaddress.ip_network(n, strict=False) for n in networks]
    for version, tool in ((4, "iptables"), (6, "ip6tables")):
        mine = [str(n) for n in nets if n.version == version]
        if not mine:
            continue
        ipt = ["ip", "netns", "exec", netns, tool, "-w"]
        run_command(*ipt, "-N", GUARD_CHAIN)
        run_command(*ipt, "-A", GUARD_CHAIN, "-i", "lo", "-j", "ACCEPT")
        run_command(*ipt, "-A", GUARD_CHAIN, "-i", tunnel_interface, "-j", "ACCEPT")
        run_command(*ipt, "-A", GUARD_CHAIN, "-m", "policy", "--dir", "in", "--pol", "ipsec", "-j", "ACCEPT")
        run_command(*ipt, "-A", GUARD_CHAIN, "-j", "DROP")
        for chain in ("INPUT", "FORWARD"):
            for net in mine:
                run_command(*ipt, "-A", chain, "-d", net, "-j", GUARD_CHAIN)
