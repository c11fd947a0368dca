"""Peers: another qoss, and the exchange by which two of them agree on a tunnel (pure).

Two qoss services, each with its own gateways, rating tables and policies, are ESAF's two
partners: each considers only its own ratings, and neither shows them to the other. The
initiating side (the application's) offers its acceptable suites *in its own order* (a rank,
never a rating or a cost); the responding side ranks the same suites by its own cost under its
own requirement, and :func:`choose` picks the suite of least combined rank, ties to the
responder's own order. Both sides then load their own charon, and each verifies its own end.

A running tunnel is moved to another suite the same way, by whichever side's edit left it
below that side's minimums: that side offers the suites it now accepts, in its own order
(:class:`Move`), the other side chooses by the same rule under its own requirement
(:class:`MoveAnswer`), and the moving side confirms once the new SA is up beside the old one.

Messages (:class:`Offer`, :class:`Answer`, :class:`Confirm`, :class:`Teardown`, :class:`Move`,
:class:`MoveAnswer`) are signed and sealed like the tunnel agent's (``app.adapters.agent.crypto``);
here they are plain documents with their checks: sizes, names, addresses, freshness.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from app.domain.algorithms import CATALOGUE, Kind
from app.domain.errors import InvalidInput
from app.domain.policies import Levels
from app.domain.retry import doubling_delay

__all__ = [
    "FRESHNESS",
    "MAX_IKES",
    "MAX_SUITES",
    "Answer",
    "Confirm",
    "Move",
    "MoveAnswer",
    "Offer",
    "Peer",
    "PeerState",
    "PeeredEnd",
    "Teardown",
    "UnheardTeardown",
    "choose",
    "parse_peered",
    "tell_again_in",
    "valid_peer_name",
]

#: Seconds a message's timestamp may be from the receiver's clock.
FRESHNESS = 30.0
#: The most suites an offer carries (the initiator's cheapest first).
MAX_SUITES = 16
#: The most IKE proposals an offer carries.
MAX_IKES = 4
#: The most networks an end names.
MAX_NETWORKS = 16
#: Seconds a responder keeps a load the initiator has not confirmed.
PENDING_FOR = 10.0
#: Seconds a teardown a peer did not hear is told again for, from the first try (then given up).
TELL_FOR = 24 * 3600.0
#: Seconds before a teardown a peer did not hear is told again the first time; twice as long each time after.
TELL_AGAIN_AFTER = 2.0
#: The longest pause between two tries of a teardown a peer did not hear, in seconds.
TELL_EVERY_AT_MOST = 300.0

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_ID = re.compile(r"^[a-z0-9-]{1,40}$")
_PROPOSAL = re.compile(r"^[a-z0-9_-]{1,200}$")
_IDENTITY = re.compile(r"^[A-Za-z0-9@._:-]{1,255}$")
_NONCE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def valid_peer_name(name: str) -> bool:
    """A peer's (and a site's) name: 1-63 of a-z, 0-9, ``.``, ``_``, ``-``, starting with a letter or digit."""
    return bool(_NAME.fullmatch(name))


class PeerState(StrEnum):
    """Whether a peering carries tunnels: ``active``; ``suspended`` (no new ones, running ones
    stay); ``revoked`` (none; its tunnels were ended)."""

    ACTIVE = "active"
    SUSPENDED = "suspended"
    REVOKED = "revoked"


@dataclass(frozen=True)
class Peer:
    """Another qoss this one has agreed to negotiate tunnels with.

    Attributes:
        name: what this side calls it; also the name it signs its messages with.
        url: its API's base URL, as this side reaches it.
        sign_key: its Ed25519 public key (32 bytes), exchanged out of band.
        kem_key: its X25519 public key (32 bytes), to seal messages to.
        mlkem_key: its ML-KEM-768 public key (1,184 bytes), sealed to beside ``kem_key`` (None: the
            peer registered none; messages to it are sealed with X25519 alone and never carry a
            post-quantum preshared key).
        gateways: this side's gateways it may ask for.
        networks: this side's networks it may ask for (each tunnel's are inside one of them).
        min_levels: what this side demands of any tunnel with it, judged in this side's tables.
        state: see :class:`PeerState`.
    """

    name: str
    url: str
    sign_key: bytes
    kem_key: bytes
    gateways: tuple[str, ...]
    networks: tuple[str, ...]
    min_levels: Levels
    state: PeerState = PeerState.ACTIVE
    created_at: str | None = None
    updated_at: str | None = None
    mlkem_key: bytes | None = None

    def allows(self, gateway: str, networks: Sequence[str]) -> str | None:
        """Why this peer may not ask for ``networks`` behind ``gateway`` (None: it may)."""
        if gateway not in self.gateways:
            return f"gateway {gateway!r} is not one this peering allows"
        allowed = [ipaddress.ip_network(n) for n in self.networks]
        for net in networks:
            wanted = ipaddress.ip_network(net, strict=False)
            if not any(wanted.version == a.version and wanted.subnet_of(a) for a in allowed):  # type: ignore[arg-type]
                return f"network {wanted} is not one this peering allows"
        return None


@dataclass(frozen=True)
class PeeredEnd:
    """One side's end of a peered tunnel, as it tells the other: its gateway's IKE address,
    the tunnel's IKE identity there, and the networks it protects."""

    address: str
    identity: str
    networks: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"address": self.address, "identity": self.identity, "networks": list(self.networks)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PeeredEnd:
        doc = _mapping(data, where, ("address", "identity", "networks"))
        address = _text(doc, "address", where)
        try:
            ipaddress.ip_address(address)
        except ValueError as exc:
            raise InvalidInput(f"{where}.address is not an IP address") from exc
        identity = _text(doc, "identity", where)
        if not _IDENTITY.fullmatch(identity):
            raise InvalidInput(f"{where}.identity is not an IKE identity qoss makes")
        return cls(address, identity, _networks(doc.get("networks"), f"{where}.networks"))


@dataclass(frozen=True)
class Offer:
    """The initiating side's offer: who, what, and its acceptable suites in its own order.

    ``suites`` are ESP proposal strings and ``ikes`` IKE proposal strings, each cheapest first
    by the initiator's own table: a rank, nothing of its ratings or costs. ``min_levels`` are the
    application's (an offer without ``post_quantum`` in them means 0). ``post_quantum``: the
    post-quantum mechanisms this side can take with the tunnel, in its order (``ppk``: a
    post-quantum preshared key the responder makes and sends in its answer, sealed hybrid); empty
    (and absent from the document, which older peers read as before) when none is asked for.
    """

    tunnel_id: str
    sender: str
    timestamp: float
    nonce: str
    gateway: str  # the responder's gateway asked for
    initiator: PeeredEnd
    networks: tuple[str, ...]  # wanted behind the responder's gateway (empty: all it protects)
    min_levels: Levels
    suites: tuple[str, ...]
    ikes: tuple[str, ...]
    mode: str
    lifetimes: tuple[int, int]  # ike, child (seconds)
    post_quantum: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**_head(self.tunnel_id, self.sender, self.timestamp, self.nonce),
                "gateway": self.gateway, "initiator": self.initiator.as_dict(), "networks": list(self.networks),
                "min_levels": self.min_levels.stored(), "suites": list(self.suites), "ikes": list(self.ikes),
                "mode": self.mode, "lifetimes": list(self.lifetimes),
                **({"post_quantum": list(self.post_quantum)} if self.post_quantum else {})}

    @classmethod
    def from_dict(cls, data: Any) -> Offer:
        doc = _mapping(data, "offer", ("tunnel_id", "sender", "timestamp", "nonce", "gateway", "initiator",
                                       "networks", "min_levels", "suites", "ikes", "mode", "lifetimes",
                                       "post_quantum"))
        suites = _proposals(doc.get("suites"), "offer.suites", MAX_SUITES)
        ikes = _proposals(doc.get("ikes"), "offer.ikes", MAX_IKES)
        mode = _text(doc, "mode", "offer")
        if mode not in ("tunnel", "transport"):
            raise InvalidInput("offer.mode is tunnel or transport")
        lifetimes = doc.get("lifetimes")
        if not (isinstance(lifetimes, list) and len(lifetimes) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and 60 <= x <= 86_400 * 7 for x in lifetimes)):
            raise InvalidInput("offer.lifetimes: [ike, child] seconds")
        return cls(
            tunnel_id=_id(doc, "tunnel_id", "offer"), sender=_name(doc, "sender", "offer"),
            timestamp=_time(doc, "offer"), nonce=_nonce(doc, "offer"), gateway=_name(doc, "gateway", "offer"),
            initiator=PeeredEnd.from_dict(doc.get("initiator"), "offer.initiator"),
            networks=_networks(doc.get("networks"), "offer.networks", empty=True),
            min_levels=Levels.from_dict(doc.get("min_levels"), "offer.min_levels"),
            suites=suites, ikes=ikes, mode=mode, lifetimes=(lifetimes[0], lifetimes[1]),
            post_quantum=_mechanisms(doc.get("post_quantum"), "offer.post_quantum"))


@dataclass(frozen=True)
class Answer:
    """The responding side's answer: the chosen suite and IKE proposal (indexes into the offer's), its own end,
    and the tunnel's key (32 bytes, only ever inside the seal). ``expires`` is the responder's
    clock by which it unloads what it loaded unless the initiator confirms. ``ppk``: where the
    chosen suite has a post-quantum preshared key, its id and its 32 bytes (the answer is then
    only ever sealed hybrid)."""

    tunnel_id: str
    sender: str
    timestamp: float
    nonce: str
    chosen: int
    ike: int
    responder: PeeredEnd
    psk: bytes
    expires: float
    ppk: tuple[str, bytes] | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {**_head(self.tunnel_id, self.sender, self.timestamp, self.nonce),
                "chosen": self.chosen, "ike": self.ike, "responder": self.responder.as_dict(), "psk": self.psk.hex(),
                "expires": int(self.expires),
                **_ppk_fields(self.ppk)}

    @classmethod
    def from_dict(cls, data: Any) -> Answer:
        doc = _mapping(data, "answer", ("tunnel_id", "sender", "timestamp", "nonce", "chosen", "ike", "responder",
                                        "psk", "expires", "ppk_id", "ppk"))
        chosen, ike = doc.get("chosen"), doc.get("ike")
        if not isinstance(chosen, int) or isinstance(chosen, bool) or not 0 <= chosen < MAX_SUITES:
            raise InvalidInput("answer.chosen is an index into the offer's suites")
        if not isinstance(ike, int) or isinstance(ike, bool) or not 0 <= ike < MAX_IKES:
            raise InvalidInput("answer.ike is an index into the offer's IKE proposals")
        psk = _text(doc, "psk", "answer")
        if not re.fullmatch(r"[0-9a-f]{64}", psk):
            raise InvalidInput("answer.psk is 32 bytes in hex")
        expires = doc.get("expires")
        if not isinstance(expires, (int, float)) or isinstance(expires, bool):
            raise InvalidInput("answer.expires is a time")
        return cls(tunnel_id=_id(doc, "tunnel_id", "answer"), sender=_name(doc, "sender", "answer"),
                   timestamp=_time(doc, "answer"), nonce=_nonce(doc, "answer"), chosen=chosen, ike=ike,
                   responder=PeeredEnd.from_dict(doc.get("responder"), "answer.responder"), psk=bytes.fromhex(psk),
                   expires=float(expires), ppk=_ppk(doc))


@dataclass(frozen=True)
class Confirm:
    """The initiator's word that its end is up (``up``) or that it gave up (``up`` false)."""

    tunnel_id: str
    sender: str
    timestamp: float
    nonce: str
    up: bool

    def as_dict(self) -> dict[str, Any]:
        return {**_head(self.tunnel_id, self.sender, self.timestamp, self.nonce),
                "up": self.up}

    @classmethod
    def from_dict(cls, data: Any) -> Confirm:
        doc = _mapping(data, "confirm", ("tunnel_id", "sender", "timestamp", "nonce", "up"))
        up = doc.get("up")
        if not isinstance(up, bool):
            raise InvalidInput("confirm.up is true or false")
        return cls(tunnel_id=_id(doc, "tunnel_id", "confirm"), sender=_name(doc, "sender", "confirm"),
                   timestamp=_time(doc, "confirm"), nonce=_nonce(doc, "confirm"), up=up)


@dataclass(frozen=True)
class Teardown:
    """Either side's word that a tunnel is being taken down: the other takes its end down too."""

    tunnel_id: str
    sender: str
    timestamp: float
    nonce: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {**_head(self.tunnel_id, self.sender, self.timestamp, self.nonce),
                "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Any) -> Teardown:
        doc = _mapping(data, "teardown", ("tunnel_id", "sender", "timestamp", "nonce", "reason"))
        reason = _text(doc, "reason", "teardown")
        if len(reason) > 200:
            raise InvalidInput("teardown.reason is at most 200 characters")
        return cls(tunnel_id=_id(doc, "tunnel_id", "teardown"), sender=_name(doc, "sender", "teardown"),
                   timestamp=_time(doc, "teardown"), nonce=_nonce(doc, "teardown"), reason=reason)


@dataclass(frozen=True)
class Move:
    """Either side's offer to move a running tunnel both sides carry: the ESP and IKE proposals
    that side accepts now, each cheapest first by its own tables (ranks, as in :class:`Offer`:
    nothing of its ratings or costs). ``post_quantum``: the post-quantum mechanisms the new SA is
    to have, as in an offer (``ppk``: the other side makes a new preshared key for the new SA and
    sends it in its answer, sealed hybrid); empty (and absent from the document) when none is
    wanted. Everything else of the tunnel (its ends, networks, mode, key) stays as it is."""

    tunnel_id: str
    sender: str
    timestamp: float
    nonce: str
    suites: tuple[str, ...]
    ikes: tuple[str, ...]
    post_quantum: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**_head(self.tunnel_id, self.sender, self.timestamp, self.nonce),
                "suites": list(self.suites), "ikes": list(self.ikes),
                **({"post_quantum": list(self.post_quantum)} if self.post_quantum else {})}

    @classmethod
    def from_dict(cls, data: Any) -> Move:
        doc = _mapping(data, "move", ("tunnel_id", "sender", "timestamp", "nonce", "suites", "ikes", "post_quantum"))
        return cls(tunnel_id=_id(doc, "tunnel_id", "move"), sender=_name(doc, "sender", "move"),
                   timestamp=_time(doc, "move"), nonce=_nonce(doc, "move"),
                   suites=_proposals(doc.get("suites"), "move.suites", MAX_SUITES),
                   ikes=_proposals(doc.get("ikes"), "move.ikes", MAX_IKES),
                   post_quantum=_mechanisms(doc.get("post_quantum"), "move.post_quantum"))


@dataclass(frozen=True)
class MoveAnswer:
    """The other side's choice for a :class:`Move` (indexes into its suites and IKE proposals),
    made under its own requirement by :func:`choose`. It has loaded the chosen proposals beside the
    running SA; ``expires`` is its clock by which it goes back to the old ones unless the moving side
    confirms. ``ppk``: where the move asked for a post-quantum preshared key, the new SA's (its id and
    32 bytes; the answer is then only ever sealed hybrid)."""

    tunnel_id: str
    sender: str
    timestamp: float
    nonce: str
    chosen: int
    ike: int
    expires: float
    ppk: tuple[str, bytes] | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {**_head(self.tunnel_id, self.sender, self.timestamp, self.nonce),
                "chosen": self.chosen, "ike": self.ike, "expires": int(self.expires),
                **_ppk_fields(self.ppk)}

    @classmethod
    def from_dict(cls, data: Any) -> MoveAnswer:
        doc = _mapping(data, "move answer", ("tunnel_id", "sender", "timestamp", "nonce", "chosen", "ike", "expires",
                                             "ppk_id", "ppk"))
        chosen, ike, expires = doc.get("chosen"), doc.get("ike"), doc.get("expires")
        if not isinstance(chosen, int) or isinstance(chosen, bool) or not 0 <= chosen < MAX_SUITES:
            raise InvalidInput("move answer.chosen is an index into the move's suites")
        if not isinstance(ike, int) or isinstance(ike, bool) or not 0 <= ike < MAX_IKES:
            raise InvalidInput("move answer.ike is an index into the move's IKE proposals")
        if not isinstance(expires, (int, float)) or isinstance(expires, bool):
            raise InvalidInput("move answer.expires is a time")
        return cls(tunnel_id=_id(doc, "tunnel_id", "move answer"), sender=_name(doc, "sender", "move answer"),
                   timestamp=_time(doc, "move answer"), nonce=_nonce(doc, "move answer"), chosen=chosen, ike=ike,
                   expires=float(expires), ppk=_ppk(doc))


def _head(tunnel_id: str, sender: str, timestamp: float, nonce: str) -> dict[str, Any]:
    """What every message carries: the tunnel, who sends it, when (whole seconds), a nonce."""
    return {"tunnel_id": tunnel_id, "sender": sender, "timestamp": int(timestamp), "nonce": nonce}


def choose(ours: Sequence[Hashable], theirs: Sequence[Hashable]) -> int | None:
    """The suite both sides accept with the least combined rank, as an index into ``ours`` (the
    initiator's order); ties go to the responder's own order (``theirs``: the suites it accepts,
    cheapest first by its own table). None: no suite is in both."""
    rank = {suite: i for i, suite in enumerate(theirs)}
    best: tuple[int, int, int] | None = None
    for i, suite in enumerate(ours):
        j = rank.get(suite)
        if j is not None and (best is None or (i + j, j) < best[:2]):
            best = (i + j, j, i)
    return best[2] if best is not None else None


def parse_peered(responder: str) -> tuple[str, str] | None:
    """``GATEWAY@PEER`` as (gateway, peer); None when ``responder`` names a local gateway.

    Raises:
        InvalidInput: an ``@`` with a gateway or peer name that is not valid.
    """
    if "@" not in responder:
        return None
    gateway, _, peer = responder.partition("@")
    if not valid_peer_name(peer) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", gateway):
        raise InvalidInput("responder GATEWAY@PEER: a gateway name and a peer name")
    return gateway, peer


def _mapping(data: Any, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where} must be an object")
    unknown = set(data) - set(keys)
    if unknown:
        raise InvalidInput(f"{where}: unknown fields {sorted(unknown)[:5]}")
    return data


_PPK_ID = re.compile(r"qoss-ppk-[0-9a-f]{8,64}")


def _mechanisms(data: Any, where: str) -> tuple[str, ...]:
    """An offer's post-quantum mechanisms: catalogue keywords of that kind, each once (absent: none)."""
    if data is None:
        return ()
    if not isinstance(data, list) or len(data) > 8 or not all(isinstance(m, str) for m in data) \
            or len(set(data)) != len(data):
        raise InvalidInput(f"{where} is a list of post-quantum mechanisms")
    for m in data:
        alg = CATALOGUE.get(m)
        if alg is None or alg.kind is not Kind.POST_QUANTUM:
            raise InvalidInput(f"{where}: {m[:32]!r} is not a post-quantum mechanism")
    return tuple(data)


def _ppk_fields(ppk: tuple[str, bytes] | None) -> dict[str, str]:
    """An answer's PPK as its document carries it (none: no fields); :func:`_ppk` reads it back."""
    return {} if ppk is None else {"ppk_id": ppk[0], "ppk": ppk[1].hex()}


def _ppk(doc: Mapping[str, Any]) -> tuple[str, bytes] | None:
    """An answer's (or a move answer's) post-quantum preshared key (its id and 32 bytes), None when it
    carries none."""
    if doc.get("ppk_id") is None and doc.get("ppk") is None:
        return None
    ppk_id, ppk = doc.get("ppk_id"), doc.get("ppk")
    if not isinstance(ppk_id, str) or not _PPK_ID.fullmatch(ppk_id):
        raise InvalidInput("answer.ppk_id is a PPK id qoss makes")
    if not isinstance(ppk, str) or not re.fullmatch(r"[0-9a-f]{64}", ppk):
        raise InvalidInput("answer.ppk is 32 bytes in hex")
    return ppk_id, bytes.fromhex(ppk)


def _proposals(data: Any, where: str, most: int) -> tuple[str, ...]:
    if not isinstance(data, list) or not 0 < len(data) <= most:
        raise InvalidInput(f"{where}: 1 to {most} proposals")
    if not all(isinstance(p, str) and _PROPOSAL.fullmatch(p) for p in data):
        raise InvalidInput(f"{where}: each is a proposal string")
    if len(set(data)) != len(data):
        raise InvalidInput(f"{where}: a proposal is offered twice")
    return tuple(data)


def _text(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value or len(value) > 255:
        raise InvalidInput(f"{where}.{key} is text")
    return value


def _name(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = _text(doc, key, where)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
        raise InvalidInput(f"{where}.{key} is not a name")
    return value


def _id(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = _text(doc, key, where)
    if not _ID.fullmatch(value):
        raise InvalidInput(f"{where}.{key} is not a tunnel id")
    return value


def _nonce(doc: Mapping[str, Any], where: str) -> str:
    value = _text(doc, "nonce", where)
    if not _NONCE.fullmatch(value):
        raise InvalidInput(f"{where}.nonce is 16-64 base64url characters")
    return value


def _time(doc: Mapping[str, Any], where: str) -> float:
    value = doc.get("timestamp")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidInput(f"{where}.timestamp is a time")
    return float(value)


def _networks(data: Any, where: str, *, empty: bool = False) -> tuple[str, ...]:
    if not isinstance(data, list) or len(data) > MAX_NETWORKS or (not data and not empty):
        raise InvalidInput(f"{where}: {'0' if empty else '1'} to {MAX_NETWORKS} networks")
    out = []
    for net in data:
        if not isinstance(net, str) or len(net) > 64:
            raise InvalidInput(f"{where}: each is a network in CIDR form")
        try:
            out.append(str(ipaddress.ip_network(net, strict=False)))
        except ValueError as exc:
            raise InvalidInput(f"{where}: {net[:45]!r} is not a network") from exc
    return tuple(out)


@dataclass(frozen=True)
class UnheardTeardown:
    """A teardown a peer did not hear (it did not answer): told again, a fresh message each time,
    after ``attempts`` tries at ``next_at``, until it answers or :data:`TELL_FOR` seconds have
    passed since ``first_at``. One per tunnel and peer."""

    peer: str
    tunnel_id: str
    reason: str
    first_at: datetime
    attempts: int
    next_at: datetime

    def again(self, now: datetime) -> UnheardTeardown | None:
        """After one more try it did not hear: the next, twice as far off as the last (at most
        :data:`TELL_EVERY_AT_MOST` seconds); None once :data:`TELL_FOR` seconds have passed."""
        if (now - self.first_at).total_seconds() >= TELL_FOR:
            return None
        attempts = self.attempts + 1
        return replace(self, attempts=attempts, next_at=now + timedelta(seconds=tell_again_in(attempts)))


def tell_again_in(attempts: int) -> float:
    """Seconds until a teardown a peer did not hear is told again after ``attempts`` tries:
    :data:`TELL_AGAIN_AFTER` after the first, twice as long each time, at most :data:`TELL_EVERY_AT_MOST`."""
    return doubling_delay(attempts, first=TELL_AGAIN_AFTER, most=TELL_EVERY_AT_MOST)
