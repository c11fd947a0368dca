"""The strongSwan side of an agent session: the ``load-conn`` bodies Target and the client
load for one session (a road warrior with a virtual IP)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from app.domain.agent.codec import AgentRejected
from app.domain.agent.parts import TunnelingInfo
from app.domain.conn_settings import child_timers, psk_ends

__all__ = [
    "AGENT_CONN_PREFIX",
    "DEVICE_NAMESPACE",
    "agent_conn_name",
    "client_conn",
    "device_conn",
    "device_identity",
    "pool6_name",
    "ppk_name",
    "target_conn",
    "virtual_ip_requests",
]

#: The agent's conns, secrets and pools on a charon are named with this prefix: its namespace,
#: which the tunnels service's reconcile never touches.
AGENT_CONN_PREFIX = "qoss-agent-"

#: Every device's name ends in this DNS suffix, the one name space a Target's device CA may vouch
#: for besides its gateway. ``.invalid`` (RFC 6761) never resolves: no site of the Internet, nor of
#: an intranet, can answer to such a name, so a certificate for one is no use there.
DEVICE_NAMESPACE = "devices.invalid"


def agent_conn_name(ticket: str) -> str:
    """The conn (and secret) name of the agent session holding ``ticket``."""
    return f"{AGENT_CONN_PREFIX}{ticket[:16]}"


def pool6_name(conn: str) -> str:
    """The name of the IPv6 pool a session of a dual-pool Target has beside its IPv4 pool (named ``conn``)."""
    return f"{conn}-6"


def ppk_name(conn: str) -> str:
    """The id of the post-quantum preshared key a client's session ``conn`` has beside its PSK
    (a device's PPK is named as its conn: it has no PSK)."""
    return f"{conn}-ppk"


def _ppk(ppk_id: str | None) -> dict[str, str]:
    """A conn's settings for a post-quantum preshared key it requires (RFC 8784, strongSwan >= 5.7)."""
    return {"ppk_id": ppk_id, "ppk_required": "yes"} if ppk_id is not None else {}


def target_conn(*, name: str, target_address: str, target_identity: str, client_identity: str,
                client_address: str | None, local_ts: Sequence[str], pool: str, ike_proposal: str,
                esp_proposal: str, mode: str, ike_lifetime: int, child_lifetime: int,
                pool6: str | None = None, ppk_id: str | None = None) -> dict[str, Any]:
    """Target's VICI ``load-conn`` body for one client (road warrior with a virtual IP from ``pool``,
    and one from ``pool6`` too if given: charon hands out one of each family the client asks for).

    The remote identity is this session's client identity, so the session key (the PSK
    loaded for exactly these two identities) admits this client and no one else. With
    ``ppk_id`` the client must also use that post-quantum preshared key.
    """
    return {
        **_ppk(ppk_id),
        "version": "2",
        "local_addrs": [target_address],
        "remote_addrs": [client_address or "%any"],
        "proposals": [ike_proposal],
        "pools": [pool, *([pool6] if pool6 else [])],
        "unique": "replace",
        "mobike": "no",
        "rekey_time": f"{ike_lifetime}s",
        **psk_ends(target_identity, client_identity),
        "children": {name: {
            "local_ts": list(local_ts),
            "esp_proposals": [esp_proposal],
            "mode": mode,
            **child_timers(child_lifetime),
        }},
    }


def device_identity(ticket: str, user_id: str) -> str:
    """A device's name in its certificate (subject CN and DNS subjectAltName): the ticket's first 12
    hex digits and the user, made a DNS name under :data:`DEVICE_NAMESPACE`
    (``0a1b2c3d4e5f.alice.devices.invalid``), at most 64 characters (a long user is cut)."""
    labels = [re.sub(r"[^a-z0-9-]", "-", label).strip("-") for label in user_id.lower().split(".")]
    name = ".".join(label[:63] for label in labels if label) or "user"
    head = f"{ticket[:12]}.{name}"[:64 - len(DEVICE_NAMESPACE) - 1].rstrip(".-")
    return f"{head}.{DEVICE_NAMESPACE}"


def device_conn(*, name: str, target_address: str, target_identity: str, device_identity: str,
                local_ts: Sequence[str], pool: str, ike_proposal: str, esp_proposal: str, mode: str,
                ike_lifetime: int, child_lifetime: int, gateway_cert: bytes, ca_cert: bytes,
                pool6: str | None = None, ppk_id: str | None = None) -> dict[str, Any]:
    """Target's VICI ``load-conn`` body for one enrolled device: a road warrior that proves itself
    with the certificate issued for it (subject ``device_identity``, a DN, signed by ``ca_cert``)
    and gets only the negotiated proposals and a virtual IP from ``pool`` (and ``pool6``). Target
    proves itself with ``gateway_cert`` (its key loaded apart). MOBIKE on: a phone moves between
    networks. With ``ppk_id``, the device must use that post-quantum preshared key (RFC 8784,
    ``ppk_required``: a device without it is refused; strongSwan >= 5.7), loaded apart."""
    return {
        **_ppk(ppk_id),
        "version": "2",
        "local_addrs": [target_address],
        "remote_addrs": ["%any"],
        "proposals": [ike_proposal],
        "pools": [pool, *([pool6] if pool6 else [])],
        "unique": "replace",
        "mobike": "yes",
        "send_cert": "always",
        "dpd_delay": "30s",
        "rekey_time": f"{ike_lifetime}s",
        "local": {"auth": "pubkey", "id": target_identity, "certs": [gateway_cert]},
        "remote": {"auth": "pubkey", "id": device_identity, "cacerts": [ca_cert]},
        "children": {name: {
            "local_ts": list(local_ts),
            "esp_proposals": [esp_proposal],
            "mode": mode,
            **child_timers(child_lifetime),
        }},
    }


def virtual_ip_requests(remote_ts: Sequence[str]) -> list[str]:
    """The virtual IPs a client asks for: one of each address family among the networks it
    reaches (``0.0.0.0`` for IPv4, ``::`` for IPv6), an IPv4 one when it names none."""
    families = {6 if ":" in ts else 4 for ts in remote_ts}
    return [vip for vip, family in (("0.0.0.0", 4), ("::", 6)) if family in families] or ["0.0.0.0"]  # noqa: S104 - any address


def client_conn(*, name: str, info: TunnelingInfo, client_address: str | None) -> dict[str, Any]:
    """The client's VICI ``load-conn`` body: asks for a virtual IP of each family among Target's
    protected networks (:func:`virtual_ip_requests`), reaches those networks; requires the
    post-quantum preshared key Target named (``info.ppk_id``), if any."""
    if info.ike_proposal is None or info.esp_proposal is None:
        raise AgentRejected("no IPsec to configure")
    conn: dict[str, Any] = {
        **_ppk(info.ppk_id),
        "version": "2",
        "remote_addrs": [info.target_address],
        "vips": virtual_ip_requests(info.remote_ts),
        "proposals": [info.ike_proposal],
        "mobike": "no",
        **psk_ends(info.client_identity, info.target_identity),
        "children": {name: {
            "remote_ts": list(info.remote_ts),
            "esp_proposals": [info.esp_proposal],
            "mode": info.mode,
            "start_action": "none",
            "close_action": "none",
        }},
    }
    if client_address is not None:
        conn["local_addrs"] = [client_address]
    return conn

