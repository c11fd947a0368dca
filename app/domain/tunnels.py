"""Tunnels: the state machine, the strongSwan configuration of a negotiated suite, and the check.

Pure: builds the VICI ``load-conn`` and ``load-shared`` messages as plain dicts (the
adapter sends them), and compares what ``list-sas`` reports with what was chosen. The
same input always gives the same payload (no clocks, no randomness in here: the PSK
and the tunnel id are made by the caller).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.domain.agent.conns import AGENT_CONN_PREFIX
from app.domain.algorithms import CATALOGUE, Kind, lookup
from app.domain.conn_settings import child_timers, psk_ends
from app.domain.errors import Conflict, InvalidInput

__all__ = [
    "TRANSITIONS",
    "ExpectedSa",
    "Gateway",
    "ObservedSa",
    "PeerEnd",
    "TunnelEnd",
    "TunnelRecord",
    "TunnelState",
    "check_transition",
    "conn_name",
    "conn_payload",
    "expected_sa",
    "gateway_capabilities",
    "has_ppk",
    "is_tunnel_conn",
    "keywords_from_charon",
    "mismatches",
    "parse_traffic_selectors",
    "ppk_secret_name",
]

#: Every conn and secret qoss loads into a charon starts with this.
_TUNNEL_PREFIX = "qoss-"


class TunnelState(StrEnum):
    """requested -> negotiated -> configuring -> up -> down, or failed from any step;
    ``noncompliant``: up, but on a suite that no longer meets its minimums (a rating or policy
    changed) and could not be moved to one that does."""

    REQUESTED = "requested"
    NEGOTIATED = "negotiated"
    CONFIGURING = "configuring"
    UP = "up"
    DOWN = "down"
    FAILED = "failed"
    NONCOMPLIANT = "noncompliant"


#: The moves a tunnel's record may make. A set-up goes requested → negotiated → configuring → up
#: (recorded once up); afterwards the monitor moves it between up and down as charon reports, a
#: re-key marks it noncompliant or moves it to a new suite (up again), reconcile finds it up,
#: restores it (up) or gives up (failed). Every store checks each move against this table.
TRANSITIONS: dict[TunnelState, frozenset[TunnelState]] = {
    TunnelState.REQUESTED: frozenset({TunnelState.NEGOTIATED, TunnelState.FAILED}),
    TunnelState.NEGOTIATED: frozenset({TunnelState.CONFIGURING, TunnelState.FAILED}),
    TunnelState.CONFIGURING: frozenset({TunnelState.UP, TunnelState.FAILED}),
    TunnelState.UP: frozenset({TunnelState.UP, TunnelState.DOWN, TunnelState.FAILED, TunnelState.CONFIGURING,
                               TunnelState.NONCOMPLIANT}),
    TunnelState.DOWN: frozenset({TunnelState.UP, TunnelState.FAILED, TunnelState.CONFIGURING}),
    TunnelState.FAILED: frozenset({TunnelState.UP, TunnelState.FAILED, TunnelState.CONFIGURING}),
    TunnelState.NONCOMPLIANT: frozenset({TunnelState.UP, TunnelState.DOWN, TunnelState.FAILED,
                                         TunnelState.NONCOMPLIANT}),
}


def check_transition(current: TunnelState, new: TunnelState) -> TunnelState:
    """``new`` if a tunnel in ``current`` may move there.

    Raises:
        Conflict: the move is not in :data:`TRANSITIONS`.
    """
    if new not in TRANSITIONS[current]:
        raise Conflict(f"a tunnel cannot go from {current.value} to {new.value}")
    return new


@dataclass(frozen=True, slots=True)
class TunnelEnd:
    """One end of a tunnel as strongSwan sees it: IKE address, identity, protected networks."""

    ike_address: str
    identity: str
    traffic_selectors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PeerEnd:
    """An unmanaged peer: a strongSwan (or other IKEv2) gateway qoss does not drive.

    Its administrator configured it with the tunnel's PSK and identities; qoss loads
    and verifies only the managed gateway's end. The PSK is never part of this record.

    A far end driven by another qoss (a peer, ``app.domain.peering``) also names that peer
    (``site``), its gateway there (``gateway``) and this side's part in the exchange
    (``role``: ``initiator`` or ``responder``).
    """

    address: str
    identity: str
    local_identity: str
    site: str | None = None
    gateway: str | None = None
    role: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {"address": self.address, "identity": self.identity, "local_identity": self.local_identity}
        if self.site is not None:
            out.update(site=self.site, gateway=self.gateway or "", role=self.role or "")
        return out


@dataclass(frozen=True)
class Gateway:
    """A strongSwan instance qoss drives: where its VICI socket is and what it can do.

    ``backend`` and ``algorithms`` are read from the charon itself (VICI ``stats`` and
    ``get-algorithms``) when the gateway is registered or refreshed.
    """

    name: str
    vici_socket: str
    ike_address: str
    identity: str
    inside_networks: tuple[str, ...]
    backend: str | None = None
    version: str | None = None
    algorithms: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vici_socket": self.vici_socket,
            "ike_address": self.ike_address,
            "identity": self.identity,
            "inside_networks": list(self.inside_networks),
            "backend": self.backend,
            "version": self.version,
            "algorithms": sorted(self.algorithms, key=lambda k: list(CATALOGUE).index(k)),
        }


@dataclass(frozen=True)
class TunnelRecord:
    """What qoss knows of one tunnel. The PSK is never part of it."""

    id: str
    initiator: str
    responder: str | None  # None: the far end is an unmanaged ``peer``
    local_ts: tuple[str, ...]
    remote_ts: tuple[str, ...]
    state: TunnelState
    negotiation: Mapping[str, Any]
    detail: str = ""
    created_at: str | None = None
    updated_at: str | None = None
    peer: PeerEnd | None = None
    #: What it was negotiated under, to negotiate it again when a rating, a policy or a
    #: gateway changes: the request (never a PSK), the rating table and its revision, the
    #: stored policy and its revision, both ends' algorithms. None for tunnels made before
    #: it was recorded.
    provenance: Mapping[str, Any] | None = None

    @property
    def conn(self) -> str:
        return conn_name(self.id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "conn": self.conn,
            "initiator": self.initiator,
            "responder": self.responder,
            "peer": self.peer.as_dict() if self.peer is not None else None,
            "local_ts": list(self.local_ts),
            "remote_ts": list(self.remote_ts),
            "state": self.state.value,
            "detail": self.detail,
            "suite": self.negotiation.get("suite"),
            "proposals": self.negotiation.get("proposals"),
            "levels": self.negotiation.get("levels"),
            "provenance": dict(self.provenance) if self.provenance is not None else None,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def conn_name(tunnel_id: str) -> str:
    """The strongSwan connection (and CHILD_SA and secret) name of a tunnel."""
    if not tunnel_id or len(tunnel_id) > 40 or not all(c.isascii() and (c.isalnum() or c == "-") for c in tunnel_id):
        raise InvalidInput("a tunnel id is 1-40 ASCII letters, digits or '-'")
    name = f"{_TUNNEL_PREFIX}{tunnel_id}"
    if not is_tunnel_conn(name):
        raise InvalidInput(f"a tunnel id may not start with {AGENT_CONN_PREFIX.removeprefix(_TUNNEL_PREFIX)!r}")
    return name


def is_tunnel_conn(name: str) -> bool:
    """Whether a conn or secret on a charon is the tunnels service's: ``qoss-*`` outside the
    tunnel agent's namespace (``qoss-agent-*``), which shares the charons."""
    return name.startswith(_TUNNEL_PREFIX) and not name.startswith(AGENT_CONN_PREFIX)


def parse_traffic_selectors(values: Sequence[str], where: str) -> tuple[str, ...]:
    """Validated CIDR traffic selectors (IPv4 or IPv6), normalised; at most 16."""
    if isinstance(values, str) or not values or len(values) > 16:
        raise InvalidInput(f"{where}: one to 16 networks in CIDR notation")
    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_network(str(value), strict=False)))
        except ValueError as exc:
            raise InvalidInput(f"{where}: {str(value)[:64]!r} is not a network in CIDR notation") from exc
    return tuple(out)


def conn_payload(
    *,
    name: str,
    local: TunnelEnd,
    remote: TunnelEnd,
    ike_proposal: str,
    esp_proposal: str | None,
    ah_proposal: str | None,
    mode: str,
    ike_lifetime: int,
    child_lifetime: int,
    ppk_id: str | None = None,
) -> dict[str, Any]:
    """The VICI ``load-conn`` settings of connection ``name`` for one end (IKEv2, PSK, one proposal each).

    The responder gets the same single proposals as the initiator, so strongSwan can only
    agree on what qoss chose (never ``default``). ``ppk_id``: the post-quantum preshared key
    both ends must use (RFC 8784, ``ppk_required``: an end without it is refused; strongSwan 5.7).
    """
    child: dict[str, Any] = {
        "local_ts": list(local.traffic_selectors),
        "remote_ts": list(remote.traffic_selectors),
        "mode": mode,
        **child_timers(child_lifetime),
    }
    if esp_proposal is not None:
        child["esp_proposals"] = [esp_proposal]
    if ah_proposal is not None:
        child["ah_proposals"] = [ah_proposal]
    conn: dict[str, Any] = {
        "version": "2",
        "local_addrs": [local.ike_address],
        "remote_addrs": [remote.ike_address],
        "proposals": [ike_proposal],
        "rekey_time": f"{ike_lifetime}s",
        "unique": "replace",
        "mobike": "no",
        **psk_ends(local.identity, remote.identity),
        "children": {name: child},
    }
    if ppk_id is not None:
        conn.update(ppk_id=ppk_id, ppk_required="yes")
    return conn


def ppk_secret_name(conn: str) -> str:
    """The id under which a tunnel's post-quantum preshared key is loaded into charon (beside
    its PSK, loaded as ``conn``), so it is unloaded with the tunnel."""
    return f"{conn}-ppk"


@dataclass(frozen=True, slots=True)
class ExpectedSa:
    """What ``list-sas`` must report for a negotiated suite, in strongSwan's names."""

    ike_encr: str
    ike_encr_keysize: int | None
    ike_integ: str | None
    ike_prf: str
    ike_dh: str
    child_protocol: str
    child_encr: str | None
    child_encr_keysize: int | None
    child_integ: str | None
    #: a post-quantum preshared key mixed into the IKE_SA's keys (and none where none was chosen)
    ike_ppk: bool = False
    #: the IKE_SA's additional key exchange (ML-KEM), in strongSwan's name
    ike_additional_ke: str | None = None


@dataclass(frozen=True, slots=True)
class ObservedSa:
    """What ``list-sas`` reported for one IKE_SA and its CHILD_SA (already decoded)."""

    ike_state: str
    ike_encr: str | None
    ike_encr_keysize: int | None
    ike_integ: str | None
    ike_prf: str | None
    ike_dh: str | None
    child_state: str | None
    child_protocol: str | None
    child_encr: str | None
    child_encr_keysize: int | None
    child_integ: str | None
    ike_ppk: bool = False
    ike_additional_ke: str | None = None


_VARIABLE_KEY = ("AES_", "CAMELLIA_", "BLOWFISH_", "NULL_AES_GMAC")


def _keysize(keyword: str) -> int | None:
    alg = CATALOGUE[keyword]
    return alg.key_size if alg.sa_name.startswith(_VARIABLE_KEY) else None


def expected_sa(*, ike: Mapping[str, str | None], protocol: str, encryption: str | None,
                integrity: str | None, post_quantum: str | None = None) -> ExpectedSa:
    """The names ``list-sas`` reports for a negotiated IKE proposal and ESP/AH suite, and its
    post-quantum mechanism (``ppk``, an ML-KEM keyword, or None)."""
    ike_encr = ike["encryption"]
    ike_prf = ike["prf"]
    ike_dh = ike["key_exchange"]
    if ike_encr is None or ike_prf is None or ike_dh is None:
        raise InvalidInput("the IKE proposal is incomplete")
    ike_integ = ike.get("integrity")
    return ExpectedSa(
        ike_encr=CATALOGUE[ike_encr].sa_name,
        ike_encr_keysize=_keysize(ike_encr),
        ike_integ=CATALOGUE[ike_integ].sa_name if ike_integ else None,
        ike_prf=CATALOGUE[ike_prf].sa_name,
        ike_dh=CATALOGUE[ike_dh].sa_name,
        child_protocol="AH" if protocol == "ah" else "ESP",
        child_encr=CATALOGUE[encryption].sa_name if encryption else None,
        child_encr_keysize=_keysize(encryption) if encryption else None,
        child_integ=CATALOGUE[integrity].sa_name if integrity else None,
        ike_ppk=post_quantum == "ppk",
        ike_additional_ke=CATALOGUE[post_quantum].sa_name if post_quantum and post_quantum != "ppk" else None,
    )


def mismatches(expected: ExpectedSa, observed: ObservedSa) -> list[str]:
    """Every difference between what was chosen and what strongSwan negotiated (empty: equal)."""
    out = []
    if observed.ike_state != "ESTABLISHED":
        out.append(f"IKE_SA state {observed.ike_state}, expected ESTABLISHED")
    if observed.child_state != "INSTALLED":
        out.append(f"CHILD_SA state {observed.child_state}, expected INSTALLED")
    pairs: list[tuple[str, object, object]] = [
        ("IKE encryption", expected.ike_encr, observed.ike_encr),
        ("IKE PRF", expected.ike_prf, observed.ike_prf),
        ("IKE key exchange", expected.ike_dh, observed.ike_dh),
        ("IKE integrity", expected.ike_integ, observed.ike_integ),
        ("CHILD_SA protocol", expected.child_protocol, observed.child_protocol),
        ("CHILD_SA encryption", expected.child_encr, observed.child_encr),
        ("CHILD_SA integrity", expected.child_integ, observed.child_integ),
    ]
    if expected.ike_ppk != observed.ike_ppk:
        out.append("IKE post-quantum preshared key: " + ("none negotiated, chosen ppk" if expected.ike_ppk
                                                         else "negotiated, none chosen"))
    if expected.ike_additional_ke != observed.ike_additional_ke:
        pairs.append(("IKE additional key exchange", expected.ike_additional_ke, observed.ike_additional_ke))
    if expected.ike_encr_keysize is not None:
        pairs.append(("IKE key size", expected.ike_encr_keysize, observed.ike_encr_keysize))
    if expected.child_encr_keysize is not None:
        pairs.append(("CHILD_SA key size", expected.child_encr_keysize, observed.child_encr_keysize))
    for what, want, got in pairs:
        if want != got:
            out.append(f"{what}: negotiated {got}, chosen {want}")
    return out


def keywords_from_charon(sections: Mapping[str, Mapping[str, str]], *, version: str | None = None) -> frozenset[str]:
    """Catalogue keywords a charon can use, from VICI ``get-algorithms`` sections and its version.

    ``get-algorithms`` names algorithms without key sizes (``AES_CBC``), so every key
    size of a listed algorithm counts; the 5.9 ``dh`` and 6.0 ``ke`` sections are both
    read, ML-KEM (``ML_KEM_768``, strongSwan 6.0) among them. Names qoss does not know are
    ignored. A post-quantum preshared key (``ppk``) is no algorithm charon lists: a charon
    has it from strongSwan 5.7 (``version``, as VICI ``version`` answers it, e.g. ``5.9.8``).
    """
    by_section = {
        "encryption": (Kind.ENCRYPTION, Kind.AEAD),
        "aead": (Kind.AEAD,),
        "integrity": (Kind.INTEGRITY,),
        "prf": (Kind.PRF,),
        "dh": (Kind.KEY_EXCHANGE, Kind.POST_QUANTUM),
        "ke": (Kind.KEY_EXCHANGE, Kind.POST_QUANTUM),
    }
    found: set[str] = set()
    for section, kinds in by_section.items():
        names = set(sections.get(section, {}))
        for alg in CATALOGUE.values():
            if alg.kind in kinds and _charon_name_matches(alg.sa_name, names):
                found.add(alg.keyword)
    if "NULL" in set(sections.get("encryption", {})):
        found.add(lookup("null").keyword)
    if has_ppk(version):
        found.add("ppk")
    return frozenset(found)


#: The first strongSwan release with post-quantum preshared keys (RFC 8784).
PPK_SINCE: tuple[int, int] = (5, 7)


def has_ppk(version: str | None) -> bool:
    """Whether a charon of this version (``5.9.8``, or ``charon 5.9.8`` as a gateway records it)
    does RFC 8784 post-quantum preshared keys; an unreadable version does not."""
    if not version:
        return False
    found = re.search(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= PPK_SINCE


def gateway_capabilities(gateway: Gateway) -> frozenset[str]:
    """What a registered gateway's charon can use: the algorithms read at registration, and a
    post-quantum preshared key where its recorded version has one (a gateway registered before
    qoss knew of them gains it without a refresh)."""
    return gateway.algorithms | ({"ppk"} if has_ppk(gateway.version) else frozenset())


def _charon_name_matches(sa_name: str, names: set[str]) -> bool:
    if sa_name in names:
        return True
    # get-algorithms lists the GCM/CCM family once per ICV length, and HMAC names
    # without the truncation suffix in some versions: compare on the common prefix.
    return any(n.startswith(sa_name) or sa_name.startswith(n + "_") for n in names)
