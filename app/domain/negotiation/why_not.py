"""Why a negotiation did not choose an algorithm ("why not X?").

The answer is read from the negotiation itself (the engine's result, and for *costlier* its
ranking of every feasible suite), never from a second set of rules:

- *chosen*: X is in the chosen ESP/AH suite or in the IKE proposal;
- *rejected*: the engine rejected X, and its reason says why (a level below a peer's
  minimum, naming the level and the peer; not rated in the table; not supported,
  forbidden or not allowed by a peer);
- *not rated*: the table that prices X's kind has no row for it;
- *costlier*: X passes every check, and the cheapest suite the engine ranks with X in it
  costs this much more than the chosen one (in the negotiation's own cost unit); for a
  key-exchange group or a post-quantum mechanism, its cost beside the chosen one's;
- *unused*: X passes every check but cannot take part in the suite the peers need (an
  encryption algorithm when AH was negotiated, a PRF the IKE proposal did not need, a
  combination ruled out by a throughput need, a post-quantum mechanism nobody asked for).

:func:`explain` is pure: the service (``app/services/why_not.py``) runs the negotiations and
hands it the pricing table and, when asked, the ranking of every suite.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.domain.algorithms import Kind, Protocol, lookup
from app.domain.negotiation.result import NegotiationResult
from app.domain.ratings import RatingTable

__all__ = ["EVERY_SUITE", "WhyNot", "explain"]

#: Enough alternatives for the engine to rank every feasible suite of a full catalogue.
EVERY_SUITE = 10_000
_BELOW = re.compile(r"^(?P<level>confidentiality|integrity|key_exchange|post_quantum) (?P<have>\S+) < (?P<need>\d+) "
                    r"required by (?P<peer>.+)$")


@dataclass(frozen=True, slots=True)
class WhyNot:
    """The answer to "why not X?" for one negotiation.

    Attributes:
        algorithm: X, as its canonical keyword.
        kind: X's kind (encryption, aead, integrity, prf, key_exchange, post_quantum).
        verdict: ``chosen``, ``rejected``, ``not_rated``, ``costlier`` or ``unused``.
        reason: one sentence that says why.
        peer: the peer whose policy or table rejected X, if one did.
        below: for a level below a minimum: ``{"level", "have", "need", "peer"}``.
        suite: for ``costlier``: the cheapest proposal with X in it.
        cost: that suite's (or group's) cost; ``chosen_cost`` the chosen one's, same unit.
        cost_unit: the unit of both costs.
    """

    algorithm: str
    kind: str
    verdict: str
    reason: str
    peer: str | None = None
    below: dict[str, Any] | None = None
    suite: str | None = None
    cost: float | None = None
    chosen_cost: float | None = None
    cost_unit: str | None = None

    @property
    def extra_cost(self) -> float | None:
        """How much more X's cheapest suite costs than the chosen one."""
        if self.cost is None or self.chosen_cost is None:
            return None
        return round(self.cost - self.chosen_cost, 6)

    def as_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "kind": self.kind, "verdict": self.verdict, "reason": self.reason,
                "peer": self.peer, "below": self.below, "suite": self.suite, "cost": self.cost,
                "chosen_cost": self.chosen_cost, "extra_cost": self.extra_cost, "cost_unit": self.cost_unit}


def explain(result: NegotiationResult, keyword: str, *, pricing: Callable[[Kind], RatingTable],
            every: Callable[[], NegotiationResult]) -> WhyNot:
    """Why ``result`` did not choose ``keyword`` (or that it did).

    Args:
        result: the negotiation asked about.
        keyword: X.
        pricing: the table that prices algorithms of a kind in that negotiation.
        every: the same negotiation ranking every feasible suite (asked only for *costlier*).

    Raises:
        UnknownAlgorithm: ``keyword`` is not in the catalogue.
    """
    alg = lookup(keyword)
    kw, kind = alg.keyword, alg.kind
    chosen = _chosen_as(result, kw)
    if chosen is not None:
        return WhyNot(kw, kind.value, "chosen", f"{kw} was chosen: {chosen}")
    rejected = next((r for r in result.rejected if r.algorithm == kw), None)
    if rejected is not None:
        below = _BELOW.match(rejected.reason)
        detail = below.groupdict() if below is not None else None
        if detail is not None:
            detail["level"] = detail["level"].replace("_", " ")
            reason = (f"{kw} is below the minimum of {detail['peer']}: its {detail['level']} level is "
                      f"{detail['have']}, {detail['peer']} needs at least {detail['need']}")
        elif rejected.reason.startswith("not rated in ") and rejected.peer is None:
            unrated_in = rejected.reason.removeprefix("not rated in ")
            return WhyNot(kw, kind.value, "not_rated", f"{kw} is not in the rating table {unrated_in}")
        else:
            reason = f"{kw} was rejected: {rejected.reason}"
        return WhyNot(kw, kind.value, "rejected", reason, peer=rejected.peer, below=detail)
    prices = pricing(kind)
    if prices.get(kw) is None:
        return WhyNot(kw, kind.value, "not_rated", f"{kw} is not in the rating table {prices.name}")
    if kind is Kind.KEY_EXCHANGE:
        return _group(result, kw, prices)
    if kind is Kind.POST_QUANTUM:
        return _mechanism(result, kw, prices)
    if kind is Kind.PRF:
        return WhyNot(kw, kind.value, "unused", f"{kw} passes every check, but the cheapest IKE proposal "
                                                f"({result.ike.get('proposal')}) uses {result.ike.get('prf')}")
    return _costlier(every, result, kw, kind)


def _chosen_as(result: NegotiationResult, kw: str) -> str | None:
    suite = result.suite
    if kw == suite.post_quantum:
        return f"it is the tunnel's post-quantum protection (level {result.levels.post_quantum})"
    if kw in (suite.encryption, suite.integrity):
        proposal = result.proposals.get("esp") or result.proposals.get("ah")
        return f"it is in the {suite.protocol.upper()} proposal {proposal}"
    if kw in (result.ike.get("encryption"), result.ike.get("integrity"), result.ike.get("prf"),
              result.ike.get("key_exchange")):
        return f"it is in the IKE proposal {result.ike.get('proposal')}"
    return None


def _group(result: NegotiationResult, kw: str, table: RatingTable) -> WhyNot:
    chosen = result.ike.get("key_exchange")
    mine, theirs = table.get(kw), table.get(chosen) if chosen else None
    if mine is None or theirs is None or not chosen:
        return WhyNot(kw, "key_exchange", "unused", f"{kw} passes every check, but IKE chose {chosen}")
    return _dearer_than_chosen(kw, mine.cost(None), chosen, theirs.cost(None), "key_exchange", "the group chosen",
                               "key-exchange")


def _mechanism(result: NegotiationResult, kw: str, table: RatingTable) -> WhyNot:
    chosen = result.suite.post_quantum
    if chosen is None:
        return WhyNot(kw, "post_quantum", "unused", f"{kw} passes every check, but no peer asks for post-quantum "
                                                    "protection (post_quantum 0), and none is paid for unasked")
    mine, theirs = table.get(kw), table.get(chosen)
    if mine is None or theirs is None:
        return WhyNot(kw, "post_quantum", "unused", f"{kw} passes every check, but {chosen} was chosen")
    return _dearer_than_chosen(kw, mine.cost(None), chosen, theirs.cost(None), "post_quantum",
                               "the post-quantum mechanism chosen", "post-quantum")


def _dearer_than_chosen(kw: str, its_cost: float, chosen: str, chosen_cost: float, kind: str, what: str,
                        level: str) -> WhyNot:
    """``kw`` met every minimum but lost to ``chosen`` on cost, or on a tie: the level named decided."""
    cost, chosen_cost = round(its_cost, 6), round(chosen_cost, 6)
    if cost > chosen_cost:
        reason = (f"{kw} meets every minimum but costs more: {cost} against {chosen_cost} for {chosen}, "
                  f"{what} ({_more(cost, chosen_cost)})")
    else:
        reason = (f"{kw} meets every minimum and costs as much as {chosen} ({cost}); {chosen} has the higher "
                  f"{level} level or comes first in the catalogue")
    return WhyNot(kw, kind, "costlier", reason, suite=kw, cost=cost, chosen_cost=chosen_cost,
                  cost_unit="1/performance")


def _costlier(every_suite: Callable[[], NegotiationResult], result: NegotiationResult, kw: str,
              kind: Kind) -> WhyNot:
    protocol = result.suite.protocol
    wire = Protocol.AH if protocol == "ah" else Protocol.ESP
    if not lookup(kw).usable_in(wire) or (protocol == "ah" and kind is not Kind.INTEGRITY):
        return WhyNot(kw, kind.value, "unused", f"{kw} passes every check, but the peers need {protocol.upper()}, "
                                                f"where a {kind.value} algorithm has no place")
    every = every_suite()
    for alternative in every.alternatives:
        parts = [p for p in (alternative["proposals"].get("esp"), alternative["proposals"].get("ah")) if p]
        if not any(kw in p.split("-") for p in parts):
            continue
        proposal = " + ".join(parts)
        cost, chosen_cost = float(alternative["cost"]), result.cost
        if cost > chosen_cost:
            reason = (f"{kw} meets every minimum but costs more: the cheapest suite with it, {proposal}, costs "
                      f"{cost} against {chosen_cost} for the suite chosen ({_more(cost, chosen_cost)})")
        else:
            reason = (f"{kw} meets every minimum and {proposal} costs as much as the suite chosen ({cost}); the "
                      "chosen one has the higher levels or comes first in the catalogue")
        return WhyNot(kw, kind.value, "costlier", reason, suite=proposal, cost=cost, chosen_cost=chosen_cost,
                      cost_unit=every.cost_unit)
    return WhyNot(kw, kind.value, "unused", f"{kw} passes every check, but no suite with it meets every "
                                            "requirement together (such as a throughput need)")


def _more(cost: float, chosen: float) -> str:
    extra = round(cost - chosen, 6)
    if chosen > 0:
        return f"+{extra}, {100 * extra / chosen:.2g}% more"
    return f"+{extra}"
