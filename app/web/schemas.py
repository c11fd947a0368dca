"""Request and response bodies (separate from the ORM and the domain).

The request documents the HTTP API, the console and the command line read are defined once,
here (``qoss negotiate`` takes what ``POST /v1/negotiations`` takes). Strict: unknown fields
are refused and nothing is coerced (a level is an int, not ``true`` or ``"8"``; a flag is a
bool); a secret (a peer's PSK) is a ``SecretStr``, never echoed. A document the services act
on becomes their domain value with ``to_domain()`` (:mod:`app.domain.requests`): services never
see pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from app.domain.agent.codec import MAX_WIRE_BYTES
from app.domain.auth import TOKEN_MAX_LIFETIME, TOKEN_NAME_MAX_LENGTH, TOKEN_NAME_PATTERN
from app.domain.negotiation import Backend
from app.domain.policies import Levels, TrafficProfile
from app.domain.requests import GatewaySpec, NegotiationSpec, PeerSpec, Secret, TunnelPeerSpec, TunnelSpec

__all__ = [
    "NO_NUL",
    "AlgorithmOut",
    "BackendIn",
    "BenchmarkIn",
    "EnrollIn",
    "ErrorOut",
    "GatewayIn",
    "MeasurementIn",
    "MessageIn",
    "MessageOut",
    "MinLevelsIn",
    "NegotiationIn",
    "NegotiationOut",
    "PeerIn",
    "PolicyIn",
    "PolicyOut",
    "RatingIn",
    "RatingPatch",
    "RatingTableIn",
    "RatingTableOut",
    "RevertIn",
    "RevisionOut",
    "Strict",
    "TokenIn",
    "TrafficIn",
    "TunnelIn",
    "TunnelPeerIn",
    "error_responses",
]

Level = Annotated[int, Field(ge=0, le=10)]
#: Free text holds no NUL: PostgreSQL's text and JSONB cannot store it (a 500 otherwise).
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, Field(max_length=2000, pattern=NO_NUL)]
Short = Annotated[str, Field(max_length=200, pattern=NO_NUL)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
#: A registered gateway's name, or ``GATEWAY@PEER``: a gateway of a peer (another qoss).
GatewayOrPeered = Annotated[str, Field(min_length=1, max_length=128,
                                       pattern=r"^[a-z0-9][a-z0-9._-]*(@[a-z0-9][a-z0-9._-]*)?$")]
Keyword = Annotated[str, Field(min_length=1, max_length=64)]
Cidr = Annotated[str, Field(min_length=1, max_length=64)]


class Strict(BaseModel):
    """The base of every request document (API and command line): unknown fields refused; no
    coercion: a level is an int, not ``true`` or ``"8"``, a flag a bool."""

    model_config = ConfigDict(extra="forbid", strict=True)


class GatewayIn(Strict):
    """A strongSwan instance to drive."""

    name: Name
    vici_socket: Annotated[str, Field(min_length=2, max_length=107, pattern=r"^/[A-Za-z0-9_./-]+$")]
    ike_address: Annotated[str, Field(min_length=2, max_length=45)]
    identity: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")] | None = None
    inside_networks: Annotated[list[Cidr], Field(min_length=1, max_length=16)]

    def to_domain(self) -> GatewaySpec:
        return GatewaySpec(name=self.name, vici_socket=self.vici_socket, ike_address=self.ike_address,
                           identity=self.identity, inside_networks=tuple(self.inside_networks))

Identity = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]*$")]


def _tuple(values: list[str] | None) -> tuple[str, ...] | None:
    return tuple(values) if values is not None else None


class MinLevelsIn(Strict):
    """Minimum security levels (0-10); an absent level is 0. ``post_quantum`` above 0 needs a
    post-quantum mechanism (a post-quantum preshared key or a hybrid ML-KEM exchange)."""

    confidentiality: Level = 0
    integrity: Level = 0
    key_exchange: Level = 0
    post_quantum: Level = 0

    def to_domain(self) -> Levels:
        return Levels(self.confidentiality, self.integrity, self.key_exchange, self.post_quantum)


class TrafficIn(Strict):
    """The traffic profile: typical packet size, needed throughput."""

    packet_size: Annotated[int, Field(ge=20, le=65535)] = 1400
    min_throughput_mbps: Annotated[float, Field(ge=0, le=1e6)] | None = None

    def to_domain(self) -> TrafficProfile:
        return TrafficProfile(self.packet_size, self.min_throughput_mbps)


class BackendIn(Strict):
    """What the data plane can do; the default is strongSwan with kernel-netlink."""

    name: Annotated[str, Field(min_length=1, max_length=64)] = "strongswan"
    ah: bool = True
    ah_esp_bundle: bool = False
    transport: bool = True

    def to_domain(self) -> Backend:
        return Backend(name=self.name, ah=self.ah, ah_esp_bundle=self.ah_esp_bundle, transport=self.transport)


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

    def to_domain(self) -> PeerSpec:
        return PeerSpec(
            name=self.name, policy=self.policy,
            min_levels=self.min_levels.to_domain() if self.min_levels is not None else None,
            objectives=_tuple(self.objectives), objective_id=self.objective_id, supports=_tuple(self.supports),
            forbids=tuple(self.forbids), rating_table=self.rating_table, strict=self.strict, pfs=self.pfs,
            mode=self.mode)


class NegotiationIn(Strict):
    """A negotiation request (POST /v1/negotiations, ``qoss negotiate``, the console's playground)."""

    rating_table: Name | None = None
    peers: Annotated[list[PeerIn], Field(min_length=1, max_length=16)]
    traffic: TrafficIn | None = None
    backend: BackendIn | None = None
    alternatives: Annotated[int, Field(ge=0, le=20)] = 5

    def to_domain(self) -> NegotiationSpec:
        return NegotiationSpec(
            peers=tuple(p.to_domain() for p in self.peers), rating_table=self.rating_table,
            traffic=self.traffic.to_domain() if self.traffic is not None else None,
            backend=self.backend.to_domain() if self.backend is not None else None,
            alternatives=self.alternatives)


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

    def to_domain(self) -> TunnelPeerSpec:
        return TunnelPeerSpec(address=self.address, identity=self.identity, local_identity=self.local_identity,
                              psk=Secret(self.psk.get_secret_value()), supports=_tuple(self.supports))


class TunnelIn(Strict):
    """A tunnel from a registered gateway to another one (``responder``), to a gateway of a peer
    (``responder`` ``GATEWAY@PEER``: another qoss, which negotiates its end) or to an unmanaged ``peer``."""

    initiator: Name
    responder: GatewayOrPeered | None = None
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

    def to_domain(self) -> TunnelSpec:
        return TunnelSpec(
            initiator=self.initiator, responder=self.responder,
            peer=self.peer.to_domain() if self.peer is not None else None,
            local_ts=_tuple(self.local_ts), remote_ts=_tuple(self.remote_ts), policy=self.policy,
            min_levels=self.min_levels.to_domain() if self.min_levels is not None else None,
            objective_id=self.objective_id, objectives=_tuple(self.objectives), forbids=tuple(self.forbids),
            rating_table=self.rating_table, traffic=self.traffic.to_domain() if self.traffic is not None else None,
            strict=self.strict)


class ErrorOut(BaseModel):
    error: str
    detail: Any


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses``: each of ``codes`` answered with an :class:`ErrorOut`, in that order."""
    return {code: {"model": ErrorOut} for code in codes}


class AlgorithmOut(BaseModel):
    keyword: str
    kind: str
    key_size: int
    block_size: int | None
    icv_length: int | None
    protocols: list[str]
    sa_name: str
    prf: str | None
    aliases: list[str]
    description: str


class MeasurementIn(Strict):
    """Where a row's numbers come from (bounds far beyond any real measurement)."""

    throughput_mbps: Annotated[float, Field(ge=0, le=1e9)] | None = None
    a_ns_per_byte: Annotated[float, Field(ge=0, le=1e9)] | None = None
    b_ns: Annotated[float, Field(ge=-1e12, le=1e12)] | None = None
    machine: Short | None = None
    backend: Short | None = None
    date: Short | None = None
    samples: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    method: Short | None = None
    spread: Annotated[float, Field(ge=0, le=1e9)] | None = None


class RatingIn(Strict):
    algorithm: Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]
    confidentiality: Level | None = None
    integrity: Level | None = None
    key_exchange: Level | None = None
    post_quantum: Level | None = None
    performance: Annotated[float, Field(ge=0, le=10)] = 0
    source: Annotated[str, Field(max_length=500, pattern=NO_NUL)] = ""
    reason: Text = ""
    requirement: Annotated[str, Field(max_length=40, pattern=NO_NUL)] | None = None
    measurement: MeasurementIn | None = None


class RatingPatch(Strict):
    """Fields of one row to change; absent fields keep their value."""

    confidentiality: Level | None = None
    integrity: Level | None = None
    key_exchange: Level | None = None
    post_quantum: Level | None = None
    performance: Annotated[float, Field(ge=0, le=10)] | None = None
    source: Annotated[str, Field(max_length=500, pattern=NO_NUL)] | None = None
    reason: Text | None = None
    requirement: Annotated[str, Field(max_length=40, pattern=NO_NUL)] | None = None
    measurement: MeasurementIn | None = None


class RatingTableIn(Strict):
    name: Name
    description: Text = ""
    source: Text = ""
    ratings: Annotated[list[RatingIn], Field(min_length=1, max_length=500)]


class RatingTableOut(BaseModel):
    name: str
    revision: int
    description: str
    source: str
    ratings: list[dict[str, Any]]


class RevertIn(Strict):
    """Go back to a past revision: a new revision with its content."""

    revision: Annotated[int, Field(ge=1, le=2**31 - 1, description="the revision whose content to restore")]
    message: Short | None = Field(default=None, description="why, for the history (after 'reverted to N')")


class RevisionOut(BaseModel):
    revision: int
    author: str
    created_at: Any
    message: str
    changes: list[dict[str, Any]] | None = None


class PolicyIn(Strict):
    name: Name
    description: Text = ""
    min_levels: MinLevelsIn | None = None
    objectives: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] | None = None
    objective_id: Annotated[int, Field(ge=1, le=4)] | None = None
    allow: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=200)] | None = None
    deny: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=200)] | None = None
    traffic: TrafficIn | None = None
    mode: Annotated[str, Field(pattern=r"^(tunnel|transport)$")] = "tunnel"
    pfs: bool = True
    strict: bool = False
    rating_table: Name | None = None
    ike_lifetime: Annotated[int, Field(ge=60, le=604800)] = 14400
    child_lifetime: Annotated[int, Field(ge=60, le=604800)] = 3600


class PolicyOut(BaseModel):
    name: str
    revision: int
    policy: dict[str, Any]


class NegotiationOut(BaseModel):
    suite: dict[str, Any]
    proposals: dict[str, str | None]
    levels: dict[str, int]
    cost: float
    cost_unit: str
    mode: str
    lifetimes: dict[str, int]
    ike: dict[str, str | None]
    alternatives: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    notes: list[str]
    requirement: dict[str, dict[str, int]]
    tables: dict[str, str]


class EnrollIn(BaseModel):
    """A user's public keys (from ``qoss agent keygen``) and the Objective-IDs they may ask for (lax: the
    console's form sends them as text)."""

    model_config = ConfigDict(extra="forbid")
    user_id: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    sign_public_key: Annotated[str, Field(min_length=43, max_length=43, pattern=r"^[A-Za-z0-9_-]+$")]
    kem_public_key: Annotated[str, Field(min_length=43, max_length=43, pattern=r"^[A-Za-z0-9_-]+$")]
    objectives: Annotated[list[Annotated[int, Field(ge=1, le=4)]], Field(min_length=1, max_length=4)]
    #: ML-KEM-768 (1,184 bytes): answers carrying a post-quantum preshared key are sealed to it and X25519.
    mlkem_public_key: Annotated[str, Field(min_length=1579, max_length=1579, pattern=r"^[A-Za-z0-9_-]+$")] | None = None


class TokenIn(BaseModel):
    """A new API token: its name, scopes and lifetime (the rules of :mod:`app.domain.auth`)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=TOKEN_NAME_MAX_LENGTH, pattern=TOKEN_NAME_PATTERN)]
    scopes: Annotated[list[Annotated[str, Field(max_length=32)]], Field(min_length=1, max_length=16)]
    expires_in: Annotated[int, Field(ge=1, le=int(TOKEN_MAX_LIFETIME.total_seconds()))] | None = None


class MessageIn(BaseModel):
    """One sealed agent message (the canonical wire bytes as text)."""

    model_config = ConfigDict(extra="forbid")
    message: Annotated[str, Field(min_length=1, max_length=MAX_WIRE_BYTES)]


class MessageOut(BaseModel):
    message: str


#: A rating table's name, as the benchmarks' request names one.
_TableName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class BenchmarkIn(BaseModel):
    """A micro benchmark run: which algorithms, how long each, and the table it may write."""

    model_config = ConfigDict(extra="forbid")

    only: Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=1, max_length=64)] | None = None
    budget_per_algorithm: Annotated[float, Field(gt=0, le=2.0)] = 0.5
    write_table: _TableName | None = None
    base_table: _TableName = "standards-2026"
