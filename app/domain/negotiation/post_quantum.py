"""Post-quantum protection: the cheapest mechanism meeting every peer's ``post_quantum`` minimum.

A minimum of 0 asks for nothing, and nothing is chosen (a tunnel never pays for more than it
asked). Above 0 the candidates are the catalogue's post-quantum mechanisms (a post-quantum
preshared key, RFC 8784; a hybrid ML-KEM exchange, RFC 9370 with FIPS 203) that every end can do
and no peer forbids, rated like any algorithm; the cheapest wins, ties going to the higher level,
then to the catalogue order.
"""

from __future__ import annotations

from app.domain.algorithms import CATALOGUE, Algorithm, Kind, Protocol, catalogue_order
from app.domain.errors import NoFeasibleSuite, UnmetRequirement
from app.domain.negotiation.context import Context
from app.domain.ratings import Rating

__all__ = ["PEERED_POST_QUANTUM", "negotiate_post_quantum", "peer_without_mlkem", "with_post_quantum"]

#: Why a tunnel with a peer (another qoss) is refused post-quantum protection other than a
#: preshared key (ML-KEM).
PEERED_POST_QUANTUM = (
    "post_quantum: with a peer, post-quantum protection is a preshared key one side makes for each new SA "
    "and sends sealed hybrid (ML-KEM-768 + X25519); ML-KEM with a peer is not offered: ask for a post_quantum "
    "minimum a preshared key meets, or 0")


def peer_without_mlkem(peer: str) -> str:
    """Why a tunnel with ``peer`` cannot have a post-quantum preshared key: a key may only cross to
    a peer sealed hybrid, and this one registered no ML-KEM-768 key."""
    return (f"post_quantum: a preshared key may only cross to a peer sealed hybrid (ML-KEM-768 + X25519), and "
            f"{peer} registered no ML-KEM-768 key: register its mlkem_public_key, or ask for post_quantum 0")


def negotiate_post_quantum(ctx: Context) -> tuple[str | None, int]:
    """The chosen mechanism's keyword and its post-quantum level; ``(None, 0)`` when no peer asks.

    Raises:
        NoFeasibleSuite: a peer asks for a post-quantum level no mechanism of both ends reaches.
    """
    if all(levels.post_quantum <= 0 for levels in ctx.mins.values()):
        return None, 0
    found: list[tuple[Algorithm, Rating]] = []
    for alg in CATALOGUE.values():
        if alg.kind is not Kind.POST_QUANTUM:
            continue
        rating = ctx.admissible(alg, ("post_quantum",))
        if rating is not None:
            found.append((alg, rating))
    if not found:
        unmet = ctx.unmet((Kind.POST_QUANTUM,), Protocol.IKE, ["post_quantum"])
        if not unmet:
            unmet = [UnmetRequirement(name, "post_quantum", levels.post_quantum, None)
                     for name, levels in ctx.mins.items() if levels.post_quantum > 0][:1]
        causes = sorted({r.reason for r in ctx.rejected.values() if r.kind == Kind.POST_QUANTUM.value})
        ctx.notes.append(
            "no post-quantum mechanism (a post-quantum preshared key or a hybrid ML-KEM exchange) that every end "
            "can do meets the post_quantum minimum" + (f" ({'; '.join(causes)})" if causes else "")
        )
        ctx.borrowed_note()
        raise NoFeasibleSuite(unmet, ctx.notes)
    alg, rating = min(found, key=lambda f: (f[1].cost(None), -(f[1].post_quantum or 0), catalogue_order(f[0].keyword)))
    return alg.keyword, rating.post_quantum or 0


def with_post_quantum(ike: dict[str, str | None], mechanism: str | None) -> dict[str, str | None]:
    """The IKE proposal with a hybrid exchange added: ML-KEM is an additional key exchange
    (``ke1_mlkem768``, strongSwan 6.0 and later) beside the classical group. A preshared key
    changes no proposal (it is the connection's ``ppk_id``), so the proposal stays as it is."""
    if mechanism is None or not mechanism.startswith("mlkem") or ike.get("proposal") is None:
        return ike
    return {**ike, "proposal": f"{ike['proposal']}-ke1_{mechanism}", "additional_key_exchange": mechanism}
