"""The documents the services accept, validated: a negotiation, a gateway to register, a
tunnel to set up. The HTTP API and the command line read the same documents (``qoss
negotiate`` takes what ``POST /v1/negotiations`` takes), so they are defined once, here.

Strict: unknown fields are refused and nothing is coerced (a level is an int, not ``true``
or ``"8"``; a flag is a bool). A secret (a peer's PSK) is a ``SecretStr``: never echoed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = [
    "BackendIn",
    "GatewayIn",
    "MinLevelsIn",
    "NegotiationIn",
    "PeerIn",
    "Strict",
    "TrafficIn",
    "TunnelIn",
    "TunnelPeerIn",
]

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
Keyword = Annotated[str, Field(min_length=1, max_length=64)]
Level = Annotated[int, Field(ge=0, le=10)]
Cidr = Annotated[str, Field(min_length=1, max_length=64)]


class Strict(BaseModel):
    """The base of every request document (API and command line): unknown fields refused; no
    coercion: a level is an int, not ``true`` or ``"8"``, a flag a bool."""

    model_config = ConfigDict(extra="forbid", strict=True)


class MinLevelsIn(Strict):
    """Minimum security levels (0-10); an absent level is 0."""

    confidentiality: Level = 0
    integrity: Level = 0
    key_exchange: Level = 0


class TrafficIn(Strict):
    """The traffic profile: typical packet size, needed throughput."""

    packet_size: Annotated[int, Field(ge=20, le=65535)] = 1400
    min_throughput_mbps: Annotated[float, Field(ge=0, le=1e6)] | None = None


class BackendIn(Strict):
    """What the data plane can do; the default is strongSwan with kernel-netlink."""

    name: Annotated[str, Field(min_length=1, max_length=64)] = "strongswan"
    ah: bool = True
    ah_esp_bundle: bool = False
    transport: bool = True


class PeerIn(Strict):
    """One party. Inline fields combine with a named stored policy: levels take the
    maximum, objectives and forbidden algorithms the union; inline flags override."""

    name: Name
    policy: Name | None = None
    min_levels: MinLevelsIn | None = None
    objectives: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] | None = None
    objective_id: Annotated[int, Field(ge=1, le=4)] | None = None
    supports: Annotated[list[Keyword], Field(max_length=200)] | None = None
    forbids: Annotated[list[Keyword], Field(max_length=200)] = []
    rating_table: Name | None = None
    strict: bool | None = None
    pfs: bool | None = None
    mode: Annotated[str, Field(pattern=r"^(tunnel|transport)$")] | None = None


class NegotiationIn(Strict):
    """A negotiation request (POST /v1/negotiations, ``qoss negotiate``)."""

    rating_table: Name | None = None
    peers: Annotated[list[PeerIn], Field(min_length=1, max_length=16)]
    traffic: TrafficIn | None = None
    backend: BackendIn | None = None
    alternatives: Annotated[int, Field(ge=0, le=20)] = 5


class GatewayIn(Strict):
    """A strongSwan instance to drive."""

    name: Name
    vici_socket: Annotated[str, Field(min_length=2, max_length=107, pattern=r"^/[A-Za-z0-9_./-]+$")]
    ike_address: Annotated[str, Field(min_length=2, max_length=45)]
    identity: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")] | None = None
    inside_networks: Annotated[list[Cidr], Field(min_length=1, max_length=16)]


Identity = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]*$")]


class TunnelPeerIn(Strict):
    """An unmanaged far end: an IKEv2 gateway qoss does not drive, set up by its own administrator.

    Its administrator configures it with ``psk``, its own ``identity`` and qoss's
    ``local_identity`` (and the proposals qoss answers with). The PSK is write-only: it
    is handed to the managed gateway's charon and otherwise forgotten — never stored,
    logged or returned, so a peer tunnel cannot be restored by reconcile (it is marked
    ``failed``; create it again).
    """

    address: Annotated[str, Field(min_length=2, max_length=45)]
    identity: Identity | None = Field(default=None, description="the peer's IKE identity (default: its address)")
    local_identity: Identity | None = Field(
        default=None, description="the managed gateway's IKE identity towards this peer (default: the gateway's)")
    psk: SecretStr = Field(min_length=32, max_length=256,
                           description="pre-shared key, 32-256 printable characters; write-only")
    supports: Annotated[list[Keyword], Field(max_length=200)] | None = Field(
        default=None, description="algorithms the peer declares (default: judged by the managed gateway alone)")

    @field_validator("psk")
    @classmethod
    def _psk_shape(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value()
        if not 32 <= len(raw) <= 256 or not raw.isascii() or not raw.isprintable():
            # Never echo the value: the message names the rule only.
            raise ValueError("psk must be 32-256 printable ASCII characters")
        return value


class TunnelIn(Strict):
    """A tunnel from a registered gateway to another one (``responder``) or to an unmanaged ``peer``."""

    initiator: Name
    responder: Name | None = None
    peer: TunnelPeerIn | None = None
    local_ts: Annotated[list[Cidr], Field(min_length=1, max_length=16)] | None = None
    remote_ts: Annotated[list[Cidr], Field(min_length=1, max_length=16)] | None = None
    policy: Name | None = None
    min_levels: MinLevelsIn | None = None
    objective_id: Annotated[int, Field(ge=1, le=4)] | None = None
    objectives: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] | None = None
    forbids: Annotated[list[Keyword], Field(max_length=200)] = []
    rating_table: Name | None = None
    traffic: TrafficIn | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _one_far_end(self) -> TunnelIn:
        if (self.responder is None) == (self.peer is None):
            raise ValueError("give exactly one of responder (a registered gateway) or peer (an unmanaged one)")
        if self.peer is not None and not self.remote_ts:
            raise ValueError("a tunnel to a peer needs remote_ts: qoss does not know the peer's networks")
        return self
