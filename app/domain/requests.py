"""What the services are asked, as values: a negotiation (its peers as the client states them,
before policies and tables are resolved) and a tunnel.

The edges (the HTTP API, the console, the command line, the lab) read and validate the
documents (:mod:`app.web.schemas`) and hand the services these values; a value here holds
already-validated fields and checks only the invariants the services rely on. The engine's own
input, with policies and tables resolved, is :class:`app.domain.negotiation.NegotiationRequest`.

Attribute names are the documents' field names, so a value reads like its document.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from app.domain.errors import InvalidInput
from app.domain.negotiation import Backend
from app.domain.policies import Levels, TrafficProfile

__all__ = ["GatewaySpec", "NegotiationSpec", "PeerSpec", "Secret", "TunnelPeerSpec", "TunnelSpec"]


class Secret:
    """A secret (an unmanaged peer's PSK) that never shows itself: not in a repr, a str, a log
    line or an error. :meth:`get_secret_value` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __str__(self) -> str:
        return "**********"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerSpec:
    """One party of a negotiation as the client states it: inline fields combine with a named
    stored ``policy`` (levels take the maximum, objectives and forbidden algorithms the union;
    inline flags override). ``supports`` None: every catalogue algorithm."""

    name: str
    policy: str | None = None
    min_levels: Levels | None = None
    objectives: tuple[str, ...] | None = None
    objective_id: int | None = None
    supports: tuple[str, ...] | None = None
    forbids: tuple[str, ...] = ()
    rating_table: str | None = None
    strict: bool | None = None
    pfs: bool | None = None
    mode: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NegotiationSpec:
    """A negotiation request (``POST /v1/negotiations``, the playground, a tunnel's or an agent
    session's negotiation): its peers, the negotiating table (None: the default one), the
    traffic, the back end (None: strongSwan with kernel-netlink) and how many alternatives to
    show.

    Raises:
        InvalidInput: no peers.
    """

    peers: tuple[PeerSpec, ...]
    rating_table: str | None = None
    traffic: TrafficProfile | None = None
    backend: Backend | None = None
    alternatives: int = 5

    def __post_init__(self) -> None:
        if not self.peers:
            raise InvalidInput("a negotiation needs at least one peer")


@dataclass(frozen=True, slots=True, kw_only=True)
class TunnelPeerSpec:
    """An unmanaged far end: its address, identities, write-only PSK and declared algorithms
    (``identity`` None: its address; ``local_identity`` None: the gateway's)."""

    address: str
    psk: Secret
    identity: str | None = None
    local_identity: str | None = None
    supports: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TunnelSpec:
    """A tunnel from a registered gateway to another one (``responder``) or to an unmanaged
    ``peer``, and what its negotiation asks.

    Raises:
        InvalidInput: not exactly one of ``responder`` and ``peer``; a peer without ``remote_ts``.
    """

    initiator: str
    responder: str | None = None
    peer: TunnelPeerSpec | None = None
    local_ts: tuple[str, ...] | None = None
    remote_ts: tuple[str, ...] | None = None
    policy: str | None = None
    min_levels: Levels | None = None
    objective_id: int | None = None
    objectives: tuple[str, ...] | None = None
    forbids: tuple[str, ...] = ()
    rating_table: str | None = None
    traffic: TrafficProfile | None = None
    strict: bool | None = None

    def __post_init__(self) -> None:
        if (self.responder is None) == (self.peer is None):
            raise InvalidInput("give exactly one of responder (a registered gateway) or peer (an unmanaged one)")
        if self.peer is not None and not self.remote_ts:
            raise InvalidInput("a tunnel to a peer needs remote_ts: qoss does not know the peer's networks")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySpec:
    """A charon to register: its name, VICI socket, IKE address, identity (None: ``NAME.qoss``)
    and the networks it protects, as given (the gateways service checks and reads the rest)."""

    name: str
    vici_socket: str
    ike_address: str
    inside_networks: tuple[str, ...]
    identity: str | None = None
