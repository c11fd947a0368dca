"""What one negotiation knows: the effective minimums, which table judges what, which candidate
algorithms pass every peer's checks, and the explanation of those that do not (rejections,
unmet requirements, notes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.domain.algorithms import CATALOGUE, Algorithm, Kind, Protocol
from app.domain.errors import InvalidInput, UnmetRequirement
from app.domain.negotiation.request import NegotiationRequest, Peer
from app.domain.negotiation.result import Rejection
from app.domain.policies import AH_OBJECTIVES, ESP_OBJECTIVES, Levels
from app.domain.ratings import Rating, RatingTable, relevant_dimensions

__all__ = ["Context"]

_DIM = {"confidentiality": 0, "integrity": 1, "key_exchange": 2, "post_quantum": 3}


class Context:
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
            self.mins[peer.name] = Levels(conf, integ, base.key_exchange, base.post_quantum)
            self.need_esp |= bool(objectives & ESP_OBJECTIVES) or conf > 0
            self.need_ah |= bool(objectives & AH_OBJECTIVES)
        self._borrowed: set[str] = set()
        self._memo: dict[tuple[str, tuple[str, ...]], Rating | None] = {}
        self._cost_tables: dict[Kind, RatingTable] = {}
        self._peer_tables: dict[tuple[str, Kind], RatingTable] = {}
        self._forbidden = [(p, p.forbids | p.policy.deny) for p in req.peers]
        self._needs = [
            (p, (self.mins[p.name].confidentiality, self.mins[p.name].integrity, self.mins[p.name].key_exchange,
                 self.mins[p.name].post_quantum))
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
