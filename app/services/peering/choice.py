"""This side's choice in a peered tunnel: what it offers a peer, and what it takes of a peer's offer.

Offering (a new tunnel or a move), this side ranks the ESP suites that meet its own requirement by
its own tables, cheapest first (:func:`ranked`), and offers its IKE proposals the same way
(:meth:`PeeredChoice.ikes`). Taking an offer, it keeps of the IKE proposals the first that alone
meets its requirement, and of the ESP proposals the one of least combined rank
(:func:`~app.domain.peering.choose`), ties to its own order (:meth:`PeeredChoice.choose`). A tunnel
it carries is judged again under its own requirement alone by :func:`negotiate_peered`.

Nothing here is sent: an offer is proposal strings in an order, an answer an index into it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from app.domain.algorithms import CATALOGUE, Protocol
from app.domain.errors import InvalidInput, NoFeasibleSuite, NotFound, PeerNoFeasibleSuite
from app.domain.negotiation import Backend, NegotiationResult, Suite
from app.domain.peering import MAX_IKES, MAX_SUITES, Peer, choose
from app.domain.policies import Levels, TrafficProfile
from app.domain.ports import UnitOfWork
from app.domain.proposals import parse as parse_proposal
from app.domain.requests import NegotiationSpec, PeerSpec
from app.domain.tunnels import Gateway, TunnelRecord, gateway_capabilities
from app.services import tunnels as local_tunnels
from app.services.negotiation import run_negotiation
from app.services.peering.config import PeeringConfig

__all__ = ["PeeredChoice", "entry", "negotiate_peered", "ranked", "requirement", "with_ike"]


class PeeredChoice:
    """This side's negotiations for its peered tunnels, in either role.

    Args:
        config: this service's name as its peers know it (named in a refusal) and its rating table of
            last resort.
    """

    def __init__(self, *, config: PeeringConfig) -> None:
        self._config = config

    def ikes(self, reads: UnitOfWork, result: NegotiationResult, *, peers: Sequence[PeerSpec],
             inputs: dict[str, Any], backends: Sequence[str | None]) -> list[NegotiationResult]:
        """This side's IKE proposals, cheapest first (``result``'s, then each next one with the
        encryption of those before it set aside), at most MAX_IKES."""
        found = [result]
        aside: list[str] = []
        while len(found) < MAX_IKES:
            cipher = found[-1].ike["encryption"]
            if cipher is None:
                break
            aside.append(cipher)
            try:
                more = self.negotiate(reads, peers=(*peers, PeerSpec(name="other-ike", forbids=tuple(aside))),
                                      inputs=inputs, backends=backends)
            except NoFeasibleSuite:
                break
            if any(f.proposals["ike"] == more.proposals["ike"] for f in found):
                break
            found.append(more)
        return found

    def choose(self, negotiate: Callable[[set[str], Sequence[PeerSpec]], NegotiationResult], peer: Peer, *,
               suites: Sequence[str], ikes: Sequence[str],
               mechanisms: Sequence[str] = ()) -> tuple[NegotiationResult, int, int]:
        """What this side takes of what ``peer`` offers, in an offer or a move: of its IKE proposals the
        first that, alone, meets this side's requirement; of its ESP proposals (``suites``) the one of
        least combined rank (:func:`~app.domain.peering.choose`), ties to this side's own order.

        Args:
            negotiate: this side's negotiation under its own requirement and the parties given, the
                peer supporting only the algorithms given.
            mechanisms: the post-quantum mechanisms the peer asks for (``ppk``: this side makes a
                preshared key whatever its own requirement, as the asking side's needs one).

        Returns:
            The chosen suite on the chosen IKE proposal, the IKE proposal's index and the suite's.

        Raises:
            PeerNoFeasibleSuite: nothing offered meets this side's requirement, or it needs a
                post-quantum preshared key that cannot be sent to ``peer`` (said without a level, an
                algorithm or a cost of this side's).
        """
        nothing = PeerNoFeasibleSuite(self._config.name, f"none of the {len(suites)} suites offered meets this "
                                                        "side's requirements")
        extra = set(mechanisms)
        asked = (PeerSpec(name="asked", min_levels=Levels(post_quantum=1)),) if extra else ()
        first: tuple[int, set[str], NegotiationResult] | None = None
        for i, proposal in enumerate(ikes):
            try:
                words = _ike_keywords(proposal)
                found = negotiate(words | extra, asked)
            except (NoFeasibleSuite, InvalidInput):
                continue
            if found.proposals["ike"] == proposal:
                first = i, words, found
                break
        if first is None:
            raise nothing
        ike, keywords, keying = first
        offered = {t for esp in suites for t in esp.split("-") if t in CATALOGUE}
        try:
            result = negotiate(offered | keywords | extra, asked)
        except (NoFeasibleSuite, InvalidInput) as exc:
            raise nothing from exc
        index = choose(suites, ranked(result))
        if index is None:
            raise nothing
        chosen = with_ike(entry(result, suites[index]), keying)
        if chosen.suite.post_quantum not in (None, "ppk") or (chosen.suite.post_quantum and peer.mlkem_key is None):
            raise PeerNoFeasibleSuite(self._config.name, "this side's post-quantum minimum needs a preshared key sent "
                                                        "sealed hybrid, to a peer with an ML-KEM-768 key")
        return chosen, ike, index

    def negotiate(self, reads: UnitOfWork, *, peers: Sequence[PeerSpec], inputs: dict[str, Any],
                  backends: Sequence[str | None]) -> NegotiationResult:
        traffic = inputs.get("traffic")
        spec = NegotiationSpec(rating_table=inputs.get("rating_table"), peers=tuple(peers),
                               traffic=TrafficProfile.from_dict(traffic) if traffic is not None else None,
                               backend=Backend.of_ends(list(backends)), alternatives=MAX_SUITES - 1)
        result = run_negotiation(uow=reads, request=spec, default_table=self._config.default_table)
        if result.suite.protocol != "esp":
            raise InvalidInput("a tunnel to a peer is protected by ESP: its requirement asks for "
                               f"{result.suite.protocol}")
        return result




def negotiate_peered(*, uow: UnitOfWork, record: TunnelRecord, default_table: str,
                     pinned: Sequence[str] | None = None) -> NegotiationResult:
    """Negotiate a peered tunnel this side carries again, under this side's own requirement alone
    (its gateway's algorithms, its policy for the peer, the request as this side has it) with the
    tables and policies as ``uow`` sees them now. ``pinned``: only among these algorithms (is the
    running suite still good enough here? :func:`app.services.rekey.judge`).

    Raises:
        NotFound: its gateway or its peer is gone.
        NoFeasibleSuite: nothing meets this side's requirement.
    """
    if record.peer is None or record.peer.site is None:
        raise NotFound(f"tunnel {record.id!r} is not one with a peer")
    gateway = uow.gateways.get(record.initiator)
    peers, inputs = requirement(record, gateway, uow.peers.get(record.peer.site))
    if pinned is not None:
        peers = (*peers, PeerSpec(name="current-suite", supports=tuple(pinned)))
    traffic = inputs.get("traffic")
    spec = NegotiationSpec(rating_table=inputs.get("rating_table"), peers=peers,
                           traffic=TrafficProfile.from_dict(traffic) if traffic is not None else None,
                           backend=Backend.of_ends([gateway.backend]))
    return run_negotiation(uow=uow, request=spec, default_table=default_table, check=True)


def requirement(record: TunnelRecord, gateway: Gateway, peer: Peer) -> tuple[tuple[PeerSpec, ...], dict[str, Any]]:
    """What this side demands of a peered tunnel it carries, as the peers of a negotiation and its
    inputs: its gateway's algorithms, its policy for the peer, and the request (the application's
    whole request on the side it was made at; the minimums the offer carried on the other)."""
    request = dict((record.provenance or {}).get("request") or {})
    own = PeerSpec(name=f"gw-{gateway.name}"[:64], supports=tuple(sorted(gateway_capabilities(gateway))))
    policy = PeerSpec(name=f"peer-{peer.name}"[:64], min_levels=peer.min_levels)
    if record.peer is not None and record.peer.role == "responder":
        return (own, policy, PeerSpec(name="request", min_levels=Levels.from_dict(request.get("min_levels")))), {}
    return (own, local_tunnels.request_peer(request), policy), request


def ranked(result: NegotiationResult) -> list[str]:
    """A negotiation's ESP proposals, cheapest first."""
    esps = [result.proposals["esp"], *(alt["proposals"].get("esp") for alt in result.alternatives)]
    out: list[str] = []
    for esp in esps:
        if esp is not None and esp not in out:
            out.append(esp)
    return out[:MAX_SUITES]


def _ike_keywords(ike: str) -> set[str]:
    """The algorithms of an IKE proposal, its PRF included where the integrity algorithm implies it.

    Raises:
        InvalidInput: not an IKE proposal.
    """
    parsed = parse_proposal(ike, Protocol.IKE)
    words = {w for w in (parsed.encryption, parsed.aead, parsed.integrity, parsed.prf, parsed.key_exchange) if w}
    if parsed.prf is None and parsed.integrity is not None and f"prf{parsed.integrity}" in CATALOGUE:
        words.add(f"prf{parsed.integrity}")
    return words


def with_ike(result: NegotiationResult, keying: NegotiationResult) -> NegotiationResult:
    """``result`` on ``keying``'s IKE proposal (and its key-exchange level)."""
    return dataclasses.replace(
        result, ike=dict(keying.ike), proposals={**result.proposals, "ike": keying.proposals["ike"]},
        suite=dataclasses.replace(result.suite, key_exchange=keying.suite.key_exchange),
        levels=dataclasses.replace(result.levels, key_exchange=keying.levels.key_exchange))


def entry(result: NegotiationResult, esp: str) -> NegotiationResult:
    """``result`` as if ``esp`` (one of its ranked ESP proposals) had been chosen: its proposals, levels and cost."""
    if esp == result.proposals["esp"]:
        return result
    alt = next(a for a in result.alternatives if a["proposals"].get("esp") == esp)
    parsed = parse_proposal(esp, Protocol.ESP)
    aead = parsed.aead is not None
    return dataclasses.replace(
        result, suite=Suite("esp", parsed.aead or parsed.encryption, None if aead else parsed.integrity,
                            result.suite.key_exchange, aead=aead, post_quantum=result.suite.post_quantum),
        proposals={**result.proposals, "esp": esp},
        levels=Levels(alt["levels"]["confidentiality"], alt["levels"]["integrity"], result.levels.key_exchange,
                      result.levels.post_quantum),
        cost=alt["cost"], alternatives=[])
