"""The engine: a request in, the cheapest suite meeting every peer's minimums out, explained."""

from __future__ import annotations

from dataclasses import replace

from app.domain.algorithms import Kind, Protocol, catalogue_order
from app.domain.errors import NoFeasibleSuite
from app.domain.negotiation.context import Context
from app.domain.negotiation.data_plane import data_plane_options, suite_and_proposals, traffic_packet_size
from app.domain.negotiation.ike import negotiate_ike
from app.domain.negotiation.post_quantum import negotiate_post_quantum, with_post_quantum
from app.domain.negotiation.protection import choose_mode, choose_option, effective_protocol
from app.domain.negotiation.request import NegotiationRequest
from app.domain.negotiation.result import NegotiationResult, Suite
from app.domain.policies import IpsecOption, Levels

__all__ = ["negotiate"]


def negotiate(request: NegotiationRequest) -> NegotiationResult:
    """Pick the cheapest suite meeting every peer's minimums, and explain the choice.

    Raises:
        InvalidInput: no peers, or duplicate peer names.
        NoFeasibleSuite: nothing meets the requirements; names each unmet one.
        UnsupportedProtection: a strict policy asks for what the back end cannot do.
    """
    ctx = Context(request)
    backend = request.backend
    option = choose_option(ctx)
    mode = choose_mode(ctx)
    packet_size = traffic_packet_size(request)
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
            levels=Levels(),
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

    protocol = effective_protocol(ctx, option, backend)
    ranked, cost_unit = data_plane_options(ctx, protocol, packet_size, request.alternatives + 1)
    if not ranked:
        dims = ["confidentiality", "integrity"] if protocol != "ah" else ["integrity"]
        kinds = (Kind.ENCRYPTION, Kind.AEAD, Kind.INTEGRITY)
        unmet = ctx.unmet(kinds, Protocol.AH if protocol == "ah" else Protocol.ESP, dims)
        ctx.borrowed_note()
        if not unmet:
            ctx.notes.append("each minimum can be met alone, but no combination meets them together")
        raise NoFeasibleSuite(unmet, ctx.notes)
    ike, ike_levels = negotiate_ike(ctx)
    pq, pq_level = negotiate_post_quantum(ctx)
    ike = with_post_quantum(ike, pq)
    ke = ike["key_exchange"] if pfs else None
    best = ranked[0]

    suite, proposals = suite_and_proposals(protocol, best, ke, ike)
    if pq is not None:
        suite = replace(suite, post_quantum=pq)
    levels = Levels(best.confidentiality, best.integrity_level, ike_levels, pq_level)
    alternatives = []
    for alt in ranked[1:]:
        _, alt_proposals = suite_and_proposals(protocol, alt, ke, ike)
        alternatives.append(
            {
                "proposals": {k: v for k, v in alt_proposals.items() if k != "ike"},
                "levels": {"confidentiality": alt.confidentiality, "integrity": alt.integrity_level},
                "cost": round(alt.cost, 6),
            }
        )
    if pq is not None:
        ctx.notes.append(f"post-quantum protection: {pq}")
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


