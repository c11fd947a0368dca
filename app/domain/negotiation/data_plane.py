"""The data plane's cost model and search: the cheapest feasible ESP/AH combinations, costed
per byte at the traffic's packet size (measured where every candidate is, else ``1 /
performance``), within the traffic's throughput need, and the proposals of the one chosen."""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

from app.domain.algorithms import CATALOGUE, Algorithm, Kind, Protocol, catalogue_order
from app.domain.negotiation.context import Context
from app.domain.negotiation.request import LIBIPSEC_NO_ESP, NegotiationRequest
from app.domain.negotiation.result import Suite, SuiteOption
from app.domain.proposals import build
from app.domain.ratings import Rating

__all__ = ["data_plane_options", "suite_and_proposals", "traffic_packet_size"]

_DEFAULT_PACKET_SIZE = 1400


def traffic_packet_size(request: NegotiationRequest) -> int:
    """The packet size costs are judged at: the request's traffic, else the first peer's, else 1400 B."""
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


def data_plane_options(
    ctx: Context, protocol: str, packet_size: int, keep: int
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


def suite_and_proposals(
    protocol: str, best: SuiteOption, ke: str | None, ike: dict[str, str | None]
) -> tuple[Suite, dict[str, str | None]]:
    """The suite and the ESP/AH/IKE proposals of one data-plane option (``ke``: the PFS group, if any)."""
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
