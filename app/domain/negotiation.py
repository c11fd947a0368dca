"""The negotiation engine: the cheapest suite that meets every peer's minimums (ESAF).

Semantics:

- Each peer states minimum levels, judged in *its own* rating table; the requirement
  is met when every peer's minimum is met. Objectives raise the minimums (an ESP
  objective implies confidentiality >= 1, an AH objective integrity >= 1) and pick the
  IPsec option (Liu et al. Table 2-2).
- Candidates are the algorithms every peer supports, every policy allows and no peer
  forbids, rated in the negotiating table (for a family that table does not rate at
  all, the default table is used and the answer says so).
- Cost is judged in the negotiating table only: a suite's cost is the sum of its
  transforms' costs (Niedermayer et al. Table 3), a transform's cost being its measured time per
  byte at the traffic's packet size where every candidate is measured, else
  ``1 / performance``.
- Ties go to the higher security levels, then to the catalogue order.
- The IKE proposal is negotiated too: encryption (or AEAD + PRF) meeting the same
  confidentiality and integrity minimums, a PRF and a key-exchange group meeting the
  key-exchange minimum. A tunnel's key-exchange level is ``min(group, prf)``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from app.domain.algorithms import CATALOGUE, Algorithm, Kind, Protocol, catalogue_order
from app.domain.errors import InvalidInput, NoFeasibleSuite, UnmetRequirement, UnsupportedProtection
from app.domain.policies import (
    AH_OBJECTIVES,
    ESP_OBJECTIVES,
    IpsecOption,
    Levels,
    Mode,
    Policy,
    TrafficProfile,
)
from app.domain.proposals import build
from app.domain.ratings import Rating, RatingTable, relevant_dimensions

__all__ = [
    "LIBIPSEC_NO_ESP",
    "Backend",
    "NegotiationRequest",
    "NegotiationResult",
    "Peer",
    "Rejection",
    "Suite",
    "SuiteOption",
    "negotiate",
]

_ALTERNATIVES = 5
_DIM = {"confidentiality": 0, "integrity": 1, "key_exchange": 2}
_DEFAULT_PACKET_SIZE = 1400


#: ESP transforms charon 5.9 with kernel-libipsec offers in ``get-algorithms`` but cannot
#: negotiate (the responder answers NO_PROPOSAL_CHOSEN), found by the catalogue sweep
#: against real charon (tests/integration/charon/test_catalogue_names.py keeps it true).
LIBIPSEC_NO_ESP: frozenset[str] = frozenset({"aes128gmac", "aes192gmac", "aes256gmac", "sha256_96"})


@dataclass(frozen=True, slots=True)
class Backend:
    """What the data plane can do (kernel-libipsec: no AH, no transport mode)."""

    name: str = "strongswan"
    ah: bool = True
    ah_esp_bundle: bool = False
    transport: bool = True


@dataclass(frozen=True)
class Peer:
    """One party: its policy, what it supports and the table its minimums are judged by.

    ``supports`` None means every catalogue algorithm. ``forbids`` adds to the
    policy's deny list.
    """

    name: str
    policy: Policy
    table: RatingTable
    supports: frozenset[str] | None = None
    forbids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NegotiationRequest:
    """Everything the engine needs; all tables already resolved."""

    peers: Sequence[Peer]
    table: RatingTable
    default_table: RatingTable
    traffic: TrafficProfile | None = None
    backend: Backend = field(default_factory=Backend)
    alternatives: int = _ALTERNATIVES


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why one algorithm could not be used, and which peer (if any) caused it."""

    algorithm: str
    kind: str
    reason: str
    peer: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "kind": self.kind, "reason": self.reason, "peer": self.peer}


@dataclass(frozen=True, slots=True)
class Suite:
    """The chosen protection. ``encryption`` holds the AEAD keyword for AEAD suites."""

    protocol: str
    encryption: str | None
    integrity: str | None
    key_exchange: str | None
    aead: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "encryption": self.encryption,
            "integrity": self.integrity,
            "key_exchange": self.key_exchange,
            "aead": self.aead,
        }


@dataclass(frozen=True, slots=True)
class SuiteOption:
    """One costed candidate for the data plane (ESP and/or AH)."""

    cipher: str | None
    integrity: str | None
    cost: float
    confidentiality: int
    integrity_level: int
    order: tuple[int, int]

    def key(self) -> tuple[float, int, int, tuple[int, int]]:
        return (self.cost, -self.confidentiality, -self.integrity_level, self.order)


@dataclass(frozen=True)
class NegotiationResult:
    """The answer, explaining itself."""

    suite: Suite
    proposals: dict[str, str | None]
    levels: Levels
    cost: float
    cost_unit: str
    mode: str
    lifetimes: dict[str, int]
    ike: dict[str, str | None]
    alternatives: list[dict[str, Any]]
    rejected: list[Rejection]
    notes: list[str]
    requirement: dict[str, dict[str, int]]
    tables: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite.as_dict(),
            "proposals": dict(self.proposals),
            "levels": self.levels.as_dict(),
            "cost": self.cost,
            "cost_unit": self.cost_unit,
            "mode": self.mode,
            "lifetimes": dict(self.lifetimes),
            "ike": dict(self.ike),
            "alternatives": list(self.alternatives),
            "rejected": [r.as_dict() for r in self.rejected],
            "notes": list(self.notes),
            "requirement": {k: dict(v) for k, v in self.requirement.items()},
            "tables": dict(self.tables),
        }


# --------------------------------------------------------------------------- helpers


class _Context:
    """Per-negotiation state: effective minimums, table lookups, rejections, notes."""

    def __init__(self, req: NegotiationRequest) -> None:
        if not req.peers:
            raise InvalidInput("a negotiation needs at least one peer")
        names = [p.name for p in req.peers]
        if len(set(names)) != len(names):
            raise InvalidInput("peer names must be unique")
        self.req = req
        self.notes: list[str] = []
        self.rejected: dict[str, Rejection] = {}
        self.need_esp = False
        self.need_ah = False
        self.mins: dict[str, Levels] = {}
        for peer in req.peers:
            objectives = peer.policy.objectives
            base = peer.policy.min_levels
            conf = max(base.confidentiality, 1 if objectives & ESP_OBJECTIVES else 0)
            integ = max(base.integrity, 1 if objectives & AH_OBJECTIVES else 0)
            self.mins[peer.name] = Levels(conf, integ, base.key_exchange)
            self.need_esp |= bool(objectives & ESP_OBJECTIVES) or conf > 0
            self.need_ah |= bool(objectives & AH_OBJECTIVES)
        self._borrowed: set[str] = set()
        self._memo: dict[tuple[str, tuple[str, ...]], Rating | None] = {}
        self._cost_tables: dict[Kind, RatingTable] = {}
        self._peer_tables: dict[tuple[str, Kind], RatingTable] = {}
        self._forbidden = [(p, p.forbids | p.policy.deny) for p in req.peers]
        self._needs = [
            (p, (self.mins[p.name].confidentiality, self.mins[p.name].integrity, self.mins[p.name].key_exchange))
            for p in req.peers
        ]

    # Tables ---------------------------------------------------------------

    def cost_table(self, kind: Kind) -> RatingTable:
        """The table that prices (and reports levels for) this kind."""
        found = self._cost_tables.get(kind)
        if found is not None:
            return found
        table = self.req.table
        if not table.covers(kind):
            if table.name != self.req.default_table.name:
                self._borrowed.add(kind.value)
            table = self.req.default_table
        self._cost_tables[kind] = table
        return table

    def peer_table(self, peer: Peer, kind: Kind) -> RatingTable:
        key = (peer.name, kind)
        found = self._peer_tables.get(key)
        if found is None:
            found = peer.table if peer.table.covers(kind) else self.req.default_table
            self._peer_tables[key] = found
        return found

    def borrowed_note(self) -> None:
        if self._borrowed:
            self.notes.append(
                f"rating table {self.req.table.name} rates no {', '.join(sorted(self._borrowed))} "
                f"algorithms: {self.req.default_table.name} used for them"
            )

    # Candidate checks ------------------------------------------------------

    def reject(self, alg: Algorithm, reason: str, peer: str | None) -> None:
        self.rejected.setdefault(alg.keyword, Rejection(alg.keyword, alg.kind.value, reason, peer))

    def admissible(self, alg: Algorithm, dims: tuple[str, ...]) -> Rating | None:
        """The cost-table rating if ``alg`` passes every peer's checks for ``dims``, else None."""
        key = (alg.keyword, dims)
        if key in self._memo:
            return self._memo[key]
        result = self._admissible(alg, dims)
        self._memo[key] = result
        return result

    def _admissible(self, alg: Algorithm, dims: tuple[str, ...]) -> Rating | None:
        kw = alg.keyword
        for peer, forbidden in self._forbidden:
            if peer.supports is not None and kw not in peer.supports and not _supported(peer, alg):
                self.reject(alg, f"not supported by {peer.name}", peer.name)
                return None
            if kw in forbidden:
                self.reject(alg, f"forbidden by {peer.name}", peer.name)
                return None
            if peer.policy.allow is not None and kw not in peer.policy.allow:
                self.reject(alg, f"not in {peer.name}'s allow list", peer.name)
                return None
        table = self.cost_table(alg.kind)
        rating = table.ratings.get(kw)
        if rating is None:
            self.reject(alg, f"not rated in {table.name}", None)
            return None
        if rating.performance <= 0:
            self.reject(alg, f"no performance rating in {table.name}", None)
            return None
        for peer, needs in self._needs:
            ptable: RatingTable | None = None
            for dim in dims:
                d = _DIM[dim]
                need = needs[d]
                if need <= 0:
                    continue
                ptable = ptable or self.peer_table(peer, alg.kind)
                entry = ptable.index.get(kw)
                if entry is None:
                    self.reject(alg, f"not rated in {ptable.name}, by which {peer.name} judges", peer.name)
                    return None
                level = entry[d]
                if level is None or level < need:
                    self.reject(alg, f"{dim} {level} < {need} required by {peer.name}", peer.name)
                    return None
        return rating

    def best_levels(self, kinds: Iterable[Kind], protocol: Protocol) -> dict[tuple[str, str], int | None]:
        """Per (peer, dimension): the best level among algorithms all peers could use."""
        best: dict[tuple[str, str], int | None] = {}
        for alg in CATALOGUE.values():
            if alg.kind not in kinds or not alg.usable_in(protocol):
                continue
            if not all(_supported(p, alg) and not _forbidden(p, alg) for p in self.req.peers):
                continue
            if self.cost_table(alg.kind).get(alg.keyword) is None:
                continue
            for peer in self.req.peers:
                prating = self.peer_table(peer, alg.kind).get(alg.keyword)
                if prating is None:
                    continue
                for dim in relevant_dimensions(alg.kind):
                    level = prating.level(dim)
                    if level is None:
                        continue
                    key = (peer.name, dim)
                    current = best.get(key)
                    best[key] = level if current is None else max(current, level)
        return best

    def unmet(self, kinds: Iterable[Kind], protocol: Protocol, dims: Sequence[str]) -> list[UnmetRequirement]:
        kinds = tuple(kinds)
        best = self.best_levels(kinds, protocol)
        out: list[UnmetRequirement] = []
        for peer in self.req.peers:
            for dim in dims:
                need = self.mins[peer.name].get(dim)
                have = best.get((peer.name, dim))
                if need > 0 and (have is None or have < need):
                    out.append(UnmetRequirement(peer.name, dim, need, have))
        return out


def _supported(peer: Peer, alg: Algorithm) -> bool:
    if peer.supports is None:
        return True
    if alg.keyword in peer.supports:
        return True
    if alg.kind is Kind.PRF:
        # A PRF is supported where the peer supports an integrity algorithm implying it.
        return any(CATALOGUE[k].prf == alg.keyword for k in peer.supports)
    return False


def _forbidden(peer: Peer, alg: Algorithm) -> bool:
    return (
        alg.keyword in peer.forbids
        or alg.keyword in peer.policy.deny
        or (peer.policy.allow is not None and alg.keyword not in peer.policy.allow)
    )


def _level(rating: Rating, dim: str) -> int:
    value = rating.level(dim)
    return value if value is not None else 0


# --------------------------------------------------------------------------- engine


def negotiate(request: NegotiationRequest) -> NegotiationResult:
    """Pick the cheapest suite meeting every peer's minimums, and explain the choice.

    Raises:
        InvalidInput: no peers, or duplicate peer names.
        NoFeasibleSuite: nothing meets the requirements; names each unmet one.
        UnsupportedProtection: a strict policy asks for what the back end cannot do.
    """
    ctx = _Context(request)
    backend = request.backend
    option = _option(ctx)
    mode = _mode(ctx)
    packet_size = _packet_size(request)
    pfs = any(p.policy.pfs for p in request.peers)
    lifetimes = {
        "ike": min(p.policy.ike_lifetime for p in request.peers),
        "child": min(p.policy.child_lifetime for p in request.peers),
    }
    requirement = {peer: levels.as_dict() for peer, levels in ctx.mins.items()}

    if option is IpsecOption.NATIVE:
        ctx.notes.append("Objective-ID 1 (Native): no IPsec protection (Liu et al. Table 2-2)")
        ctx.borrowed_note()
        return NegotiationResult(
            suite=Suite("none", None, None, None),
            proposals={"esp": None, "ah": None, "ike": None},
            levels=Levels(0, 0, 0),
            cost=0.0,
            cost_unit="none",
            mode=mode,
            lifetimes=lifetimes,
            ike={"encryption": None, "integrity": None, "prf": None, "key_exchange": None},
            alternatives=[],
            rejected=[],
            notes=ctx.notes,
            requirement=requirement,
            tables=_tables(request),
        )

    protocol = _effective_protocol(ctx, option, backend)
    ranked, cost_unit = _data_plane_options(ctx, protocol, packet_size, request.alternatives + 1)
    if not ranked:
        dims = ["confidentiality", "integrity"] if protocol != "ah" else ["integrity"]
        kinds = (Kind.ENCRYPTION, Kind.AEAD, Kind.INTEGRITY)
        unmet = ctx.unmet(kinds, Protocol.AH if protocol == "ah" else Protocol.ESP, dims)
        ctx.borrowed_note()
        if not unmet:
            ctx.notes.append("each minimum can be met alone, but no combination meets them together")
        raise NoFeasibleSuite(unmet, ctx.notes)
    ike, ike_levels = _negotiate_ike(ctx)
    ke = ike["key_exchange"] if pfs else None
    best = ranked[0]

    suite, proposals = _suite_and_proposals(protocol, best, ke, ike)
    levels = Levels(best.confidentiality, best.integrity_level, ike_levels)
    alternatives = []
    for alt in ranked[1:]:
        _, alt_proposals = _suite_and_proposals(protocol, alt, ke, ike)
        alternatives.append(
            {
                "proposals": {k: v for k, v in alt_proposals.items() if k != "ike"},
                "levels": {"confidentiality": alt.confidentiality, "integrity": alt.integrity_level},
                "cost": round(alt.cost, 6),
            }
        )
    if pfs:
        ctx.notes.append(f"PFS: CHILD_SA rekeying uses {ike['key_exchange']}")
    ctx.borrowed_note()
    rejected = sorted(ctx.rejected.values(), key=lambda r: catalogue_order(r.algorithm))
    return NegotiationResult(
        suite=suite,
        proposals=proposals,
        levels=levels,
        cost=round(best.cost, 6),
        cost_unit=cost_unit,
        mode=mode,
        lifetimes=lifetimes,
        ike=ike,
        alternatives=alternatives,
        rejected=rejected,
        notes=ctx.notes,
        requirement=requirement,
        tables=_tables(request),
    )


def _tables(request: NegotiationRequest) -> dict[str, str]:
    out = {"negotiation": request.table.name, "default": request.default_table.name}
    for peer in request.peers:
        out[peer.name] = peer.table.name
    return out


def _option(ctx: _Context) -> IpsecOption:
    peers = ctx.req.peers
    if ctx.need_ah and ctx.need_esp:
        return IpsecOption.AH_ESP
    if ctx.need_ah:
        return IpsecOption.AH
    if ctx.need_esp:
        return IpsecOption.ESP
    if all(p.policy.wants_native for p in peers) and all(
        ctx.mins[p.name] == Levels() for p in peers
    ):
        return IpsecOption.NATIVE
    ctx.notes.append("no objective names a protocol: ESP (the default)")
    return IpsecOption.ESP


def _strict(ctx: _Context) -> list[str]:
    return [p.name for p in ctx.req.peers if p.policy.strict]


def _effective_protocol(ctx: _Context, option: IpsecOption, backend: Backend) -> str:
    """Map the IPsec option onto what the back end can do, with the documented fallbacks."""
    if option is IpsecOption.AH:
        if backend.ah:
            return "ah"
        strict = _strict(ctx)
        if strict:
            raise UnsupportedProtection(
                f"the objectives ask for AH, which the {backend.name} back end cannot do, "
                f"and the policy of {', '.join(strict)} is strict"
            )
        ctx.notes.append(f"AH unavailable on the {backend.name} back end: ESP with NULL encryption instead")
        return "esp-null"
    if option is IpsecOption.AH_ESP:
        if backend.ah and backend.ah_esp_bundle:
            return "ah+esp"
        strict = _strict(ctx)
        if strict:
            raise UnsupportedProtection(
                f"the objectives ask for AH+ESP, which the {backend.name} back end cannot bundle, "
                f"and the policy of {', '.join(strict)} is strict"
            )
        ctx.notes.append(
            f"AH+ESP bundles unavailable on the {backend.name} back end: ESP with integrity instead"
        )
        return "esp"
    return "esp"


def _mode(ctx: _Context) -> str:
    wants_transport = all(p.policy.mode is Mode.TRANSPORT for p in ctx.req.peers)
    if not wants_transport:
        return Mode.TUNNEL.value
    if ctx.req.backend.transport:
        return Mode.TRANSPORT.value
    strict = _strict(ctx)
    if strict:
        raise UnsupportedProtection(
            f"transport mode is unavailable on the {ctx.req.backend.name} back end "
            f"and the policy of {', '.join(strict)} is strict"
        )
    ctx.notes.append(f"transport mode unavailable on the {ctx.req.backend.name} back end: tunnel mode instead")
    return Mode.TUNNEL.value


def _packet_size(request: NegotiationRequest) -> int:
    if request.traffic is not None:
        return request.traffic.packet_size
    for peer in request.peers:
        if peer.policy.traffic is not None:
            return peer.policy.traffic.packet_size
    return _DEFAULT_PACKET_SIZE


def _min_throughput(request: NegotiationRequest) -> float | None:
    needs = [request.traffic.min_throughput_mbps] if request.traffic else []
    needs += [p.policy.traffic.min_throughput_mbps for p in request.peers if p.policy.traffic]
    present = [n for n in needs if n is not None]
    return max(present) if present else None


class _Cand(NamedTuple):
    """A candidate transform, flattened for the hot loops."""

    keyword: str
    cost: float
    conf: int
    integ: int
    order: int
    mbps: float | None


def _cand(alg: Algorithm, rating: Rating, cost: float) -> _Cand:
    mbps = rating.measurement.throughput_mbps if rating.measurement is not None else None
    return _Cand(alg.keyword, cost, rating.confidentiality or 0, rating.integrity or 0,
                 catalogue_order(alg.keyword), mbps)


def _data_plane_options(
    ctx: _Context, protocol: str, packet_size: int, keep: int
) -> tuple[list[SuiteOption], str]:
    """The ``keep`` cheapest feasible ESP/AH combinations, ranked (cost, higher levels, order)."""
    wire = Protocol.AH if protocol == "ah" else Protocol.ESP
    found: list[tuple[Algorithm, Rating, str]] = []
    libipsec = ctx.req.backend.name == "kernel-libipsec"
    for alg in CATALOGUE.values():
        if not alg.usable_in(wire):
            continue
        if libipsec and wire is Protocol.ESP and alg.keyword in LIBIPSEC_NO_ESP:
            ctx.reject(alg, "kernel-libipsec cannot negotiate it in ESP", None)
            continue
        if alg.kind is Kind.INTEGRITY:
            rating = ctx.admissible(alg, ("integrity",))
            role = "integ"
        elif protocol != "ah" and alg.kind is Kind.ENCRYPTION:
            rating = ctx.admissible(alg, ("confidentiality",))
            role = "cipher"
        elif protocol in ("esp", "esp-null") and alg.kind is Kind.AEAD:
            rating = ctx.admissible(alg, ("confidentiality", "integrity"))
            role = "aead"
        else:
            continue
        if rating is not None:
            found.append((alg, rating, role))

    # Only transforms that can take part in a suite decide whether costs are measured
    # (an integrity algorithm with no cipher to pair with is irrelevant).
    roles = {role for _, _, role in found}
    pairs = "cipher" in roles and "integ" in roles
    relevant = [
        (alg, r, role) for alg, r, role in found
        if protocol == "ah" or role == "aead" or pairs
    ]
    measured = bool(relevant) and all(r.measured_cost(packet_size) is not None for _, r, _ in relevant)
    if measured:
        unit = f"ns/byte at {packet_size} B (measured)"
        costs = [r.measured_cost(packet_size) or math.inf for _, r, _ in found]
    else:
        unit = "1/performance"
        if any(r.measurement is not None for _, r, _ in relevant):
            ctx.notes.append("not every candidate is measured: costs from performance scores (1/performance)")
        costs = [r.cost(packet_size) for _, r, _ in found]
    ciphers: list[_Cand] = []
    aeads: list[_Cand] = []
    integs: list[_Cand] = []
    by_role = {"cipher": ciphers, "aead": aeads, "integ": integs}
    for (alg, rating, role), cost in zip(found, costs, strict=True):
        if role == "integ" and protocol == "ah+esp" and not alg.usable_in(Protocol.AH):
            continue
        by_role[role].append(_cand(alg, rating, cost))

    need_mbps = _min_throughput(ctx.req)
    if need_mbps is not None and not measured:
        ctx.notes.append(f"throughput need of {need_mbps} Mbit/s not checked: candidates are not measured")
    check_mbps = need_mbps is not None and measured

    Key = tuple[float, int, int, int, int]
    keyed: list[tuple[Key, _Cand | None, _Cand | None]] = []
    if protocol == "ah":
        keyed = [((i.cost, 0, -i.integ, -1, i.order), None, i) for i in integs]
    else:
        keyed = [((c.cost + i.cost, -c.conf, -i.integ, c.order, i.order), c, i) for c in ciphers for i in integs]
        if protocol != "ah+esp":
            keyed += [((a.cost, -a.conf, -a.integ, a.order, -1), a, None) for a in aeads]
    if check_mbps:
        assert need_mbps is not None
        keyed = [k for k in keyed if _throughput(k[1], k[2]) >= need_mbps]
    if protocol == "esp-null":
        integrity_only = [k for k in keyed if k[0][1] == 0]
        if integrity_only:
            keyed = integrity_only
        elif keyed:
            ctx.notes.append("no integrity-only ESP suite is rated: ESP with encryption instead")
    ranked = heapq.nsmallest(keep, keyed, key=lambda k: k[0])
    options = [
        SuiteOption(
            cipher=c.keyword if c else None,
            integrity=i.keyword if i else None,
            cost=key[0],
            confidentiality=c.conf if c else 0,
            integrity_level=i.integ if i else (c.integ if c else 0),
            order=(key[3], key[4]),
        )
        for key, c, i in ranked
    ]
    return options, unit


def _throughput(*parts: _Cand | None) -> float:
    """Combined throughput of transforms applied in series (inf where one is unmeasured)."""
    rates = [p.mbps for p in parts if p is not None]
    if any(r is None or r <= 0 for r in rates):
        return math.inf
    return 1.0 / sum(1.0 / r for r in rates if r)


def _suite_and_proposals(
    protocol: str, best: SuiteOption, ke: str | None, ike: dict[str, str | None]
) -> tuple[Suite, dict[str, str | None]]:
    ike_proposal = ike["proposal"]
    if protocol == "ah":
        integ = best.integrity
        ah = build(Protocol.AH, integrity=integ, key_exchange=ke)
        return Suite("ah", None, integ, ike["key_exchange"]), {"esp": None, "ah": ah, "ike": ike_proposal}
    cipher = best.cipher
    is_aead = cipher is not None and CATALOGUE[cipher].kind is Kind.AEAD
    if protocol == "ah+esp":
        esp = build(Protocol.ESP, encryption=cipher, key_exchange=ke, allow_encryption_only=True)
        ah = build(Protocol.AH, integrity=best.integrity, key_exchange=ke)
        return (
            Suite("ah+esp", cipher, best.integrity, ike["key_exchange"]),
            {"esp": esp, "ah": ah, "ike": ike_proposal},
        )
    if is_aead:
        esp = build(Protocol.ESP, aead=cipher, key_exchange=ke)
    else:
        esp = build(Protocol.ESP, encryption=cipher, integrity=best.integrity, key_exchange=ke)
    suite = Suite("esp", cipher, None if is_aead else best.integrity, ike["key_exchange"], aead=is_aead)
    return suite, {"esp": esp, "ah": None, "ike": ike_proposal}


def _negotiate_ike(ctx: _Context) -> tuple[dict[str, str | None], int]:
    """The IKE proposal: cheapest (encr+integ | aead+prf) and cheapest group meeting the minimums."""
    groups: list[tuple[Algorithm, Rating]] = []
    prfs: dict[str, Rating] = {}
    for alg in CATALOGUE.values():
        if alg.kind is Kind.KEY_EXCHANGE:
            rating = ctx.admissible(alg, ("key_exchange",))
            if rating is not None:
                groups.append((alg, rating))
        elif alg.kind is Kind.PRF:
            rating = ctx.admissible(alg, ("key_exchange",))
            if rating is not None:
                prfs[alg.keyword] = rating
    if not groups or not prfs:
        kinds = (Kind.KEY_EXCHANGE,) if not groups else (Kind.PRF,)
        unmet = ctx.unmet(kinds, Protocol.IKE, ["key_exchange"])
        if not unmet:
            unmet = [UnmetRequirement(p.name, "key_exchange", ctx.mins[p.name].key_exchange, None)
                     for p in ctx.req.peers][:1]
        ctx.notes.append(
            "IKE needs a key-exchange group and a PRF supported by every peer"
            if not unmet or unmet[0].best_available is None
            else "no key-exchange group or PRF meets the minimum"
        )
        ctx.borrowed_note()
        raise NoFeasibleSuite(unmet, ctx.notes)

    group_alg, group_rating = min(
        groups,
        key=lambda g: (g[1].cost(None), -_level(g[1], "key_exchange"), catalogue_order(g[0].keyword)),
    )

    # Candidate IKE transforms, judged without the ESP/AH rejection bookkeeping polluting
    # the data-plane explanation (they share the same checks, so reasons agree).
    best: tuple[tuple[float, int, int, tuple[int, int]], dict[str, str | None], int] | None = None
    enc_candidates: list[tuple[Algorithm, Rating]] = []
    aead_candidates: list[tuple[Algorithm, Rating]] = []
    integ_candidates: list[tuple[Algorithm, Rating, Rating]] = []
    for alg in CATALOGUE.values():
        if not alg.usable_in(Protocol.IKE):
            continue
        if alg.kind is Kind.ENCRYPTION:
            r = ctx.admissible(alg, ("confidentiality",))
            if r is not None:
                enc_candidates.append((alg, r))
        elif alg.kind is Kind.AEAD:
            r = ctx.admissible(alg, ("confidentiality", "integrity"))
            if r is not None:
                aead_candidates.append((alg, r))
        elif alg.kind is Kind.INTEGRITY and alg.prf is not None and alg.prf in prfs:
            r = ctx.admissible(alg, ("integrity",))
            if r is not None:
                integ_candidates.append((alg, r, prfs[alg.prf]))

    encs = [(er.cost(None), _level(er, "confidentiality"), catalogue_order(e.keyword), e.keyword)
            for e, er in enc_candidates]
    integs = [(ir.cost(None), min(_level(ir, "integrity"), _level(pr, "key_exchange")), catalogue_order(i.keyword),
               i.keyword, i.prf, _level(pr, "key_exchange")) for i, ir, pr in integ_candidates]
    prf_list = [(pr.cost(None), _level(pr, "key_exchange"), catalogue_order(name), name) for name, pr in prfs.items()]
    for e_cost, e_conf, e_order, e_kw in encs:
        for i_cost, i_level, i_order, i_kw, i_prf, p_level in integs:
            key = (e_cost + i_cost, -e_conf, -i_level, (e_order, i_order))
            if best is None or key < best[0]:
                best = (key, {"encryption": e_kw, "integrity": i_kw, "prf": i_prf}, p_level)
    for aead, ar in aead_candidates:
        a_cost, a_conf, a_integ, a_order = (ar.cost(None), _level(ar, "confidentiality"), _level(ar, "integrity"),
                                            catalogue_order(aead.keyword))
        for p_cost, p_level, p_order, p_name in prf_list:
            key = (a_cost + p_cost, -a_conf, -min(a_integ, p_level), (a_order, p_order))
            if best is None or key < best[0]:
                best = (key, {"encryption": aead.keyword, "integrity": None, "prf": p_name}, p_level)
    if best is None:
        unmet = ctx.unmet((Kind.ENCRYPTION, Kind.AEAD, Kind.INTEGRITY), Protocol.IKE,
                          ["confidentiality", "integrity"])
        ctx.borrowed_note()
        if not enc_candidates and not aead_candidates:
            ctx.notes.append("IKE: no encryption or AEAD algorithm usable in IKE meets the minimums")
        else:
            prf_names = ", ".join(sorted(prfs))
            ctx.notes.append(
                "IKE: no integrity algorithm whose PRF is usable (usable PRFs: "
                f"{prf_names}) and no AEAD; integrity algorithms imply their PRF"
            )
        raise NoFeasibleSuite(unmet, ctx.notes)

    _, ike, prf_level = best
    enc_kw = ike["encryption"]
    assert enc_kw is not None
    if CATALOGUE[enc_kw].kind is Kind.AEAD:
        proposal = build(Protocol.IKE, aead=enc_kw, prf=ike["prf"], key_exchange=group_alg.keyword)
    else:
        proposal = build(Protocol.IKE, encryption=enc_kw, integrity=ike["integrity"], key_exchange=group_alg.keyword)
    ike = {**ike, "key_exchange": group_alg.keyword, "proposal": proposal}
    ke_level = min(_level(group_rating, "key_exchange"), prf_level)
    return ike, ke_level

