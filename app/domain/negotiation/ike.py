"""The IKE proposal: the cheapest encryption and integrity (or AEAD and PRF) meeting the
confidentiality and integrity minimums, and the cheapest key-exchange group; a tunnel's
key-exchange level is ``min(group, prf)``."""

from __future__ import annotations

from app.domain.algorithms import CATALOGUE, Algorithm, Kind, Protocol, catalogue_order
from app.domain.errors import NoFeasibleSuite, UnmetRequirement
from app.domain.negotiation.context import Context
from app.domain.proposals import build
from app.domain.ratings import Rating

__all__ = ["negotiate_ike"]



def _level(rating: Rating, dim: str) -> int:
    value = rating.level(dim)
    return value if value is not None else 0


def negotiate_ike(ctx: Context) -> tuple[dict[str, str | None], int]:
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
