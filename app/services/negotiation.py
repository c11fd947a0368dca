"""The negotiation use case: resolve policies and tables, run the pure engine.

Its input is :class:`app.domain.requests.NegotiationSpec`, the value every edge makes of the
one negotiation document (:class:`app.web.schemas.NegotiationIn`: ``POST /v1/negotiations``,
``qoss negotiate``, the console's playground) and the tunnels and the agent build themselves.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from app.domain.negotiation import Backend, NegotiationRequest, NegotiationResult, Peer, negotiate
from app.domain.policies import Levels, Policy, keyword_set, parse_objectives
from app.domain.ports import NO_METRICS, Metrics, UnitOfWork, error_label
from app.domain.ratings import RatingTable
from app.domain.requests import NegotiationSpec, PeerSpec
from app.services.ratings import TableCache

__all__ = ["run_negotiation"]

class _Results:
    """The last few negotiations' results, by everything they depend on.

    The engine is a pure function of the request, the tables it reads and the named
    policies' contents: the same inputs give the same result, so a repeated request (every
    tunnel or agent connect with the same minimums) is answered without running it again.
    Tables are keyed by identity: :class:`~app.services.ratings.TableCache` hands out one
    object per table revision and a new object for any change, and an entry holds its tables,
    so their ids cannot be reused while it lives. Policies are keyed by content (frozen).
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._results: OrderedDict[tuple[Any, ...], tuple[NegotiationResult, tuple[RatingTable, ...]]] = (
            OrderedDict())

    def get(self, key: tuple[Any, ...]) -> NegotiationResult | None:
        with self._lock:
            found = self._results.get(key)
            if found is None:
                return None
            self._results.move_to_end(key)
            return found[0]

    def put(self, key: tuple[Any, ...], result: NegotiationResult, tables: tuple[RatingTable, ...]) -> None:
        with self._lock:
            self._results[key] = (result, tables)
            self._results.move_to_end(key)
            while len(self._results) > self._size:
                self._results.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._results.clear()


_RESULTS = _Results(256)


def run_negotiation(
    *, uow: UnitOfWork, cache: TableCache, request: NegotiationSpec, default_table: str, metrics: Metrics = NO_METRICS,
) -> NegotiationResult:
    """Resolve the request's policies and tables, then negotiate (or reuse the result of the
    same inputs: see :class:`_Results`; callers must not change a result).

    Raises:
        NotFound: a named policy or rating table does not exist.
        InvalidPolicy: an unknown objective or algorithm keyword.
        NoFeasibleSuite: nothing meets the minimums (409).

    ``metrics``: the negotiation is counted by outcome (``qoss_negotiations_total``: ``chosen``
    or the error's name).
    """
    try:
        result = _run_negotiation(uow=uow, cache=cache, request=request, default_table=default_table)
    except Exception as exc:
        metrics.count("qoss_negotiations_total", outcome=error_label(exc))
        raise
    metrics.count("qoss_negotiations_total", outcome="chosen")
    return result


def _run_negotiation(
    *, uow: UnitOfWork, cache: TableCache, request: NegotiationSpec, default_table: str
) -> NegotiationResult:
    default = cache.get(uow.tables, default_table)
    table = cache.get(uow.tables, request.rating_table) if request.rating_table else default
    policies = uow.policies
    stored_policies: list[Policy | None] = []
    resolved: list[tuple[PeerSpec, Policy, RatingTable]] = []
    for p in request.peers:
        stored = policies.get(p.policy)[0] if p.policy else None
        stored_policies.append(stored)
        policy = (stored or Policy(name="inline")).for_peer(
            min_levels=p.min_levels or Levels(),
            objectives=parse_objectives(p.objectives, p.objective_id), objective_id=p.objective_id,
            mode=p.mode, pfs=p.pfs, strict=p.strict, rating_table=p.rating_table)
        resolved.append((p, policy, cache.get(uow.tables, policy.rating_table) if policy.rating_table else table))
    tables = (default, table, *(peer_table for _, _, peer_table in resolved))
    key = (request, tuple(id(t) for t in tables), tuple(stored_policies))
    cached = _RESULTS.get(key)
    if cached is not None:  # the same inputs were checked (keywords included) when it was made
        return cached
    peers = [
        Peer(
            name=p.name,
            policy=policy,
            table=peer_table,
            supports=keyword_set(p.supports, f"peers[{p.name}].supports") if p.supports is not None else None,
            forbids=keyword_set(p.forbids, f"peers[{p.name}].forbids"),
        )
        for p, policy, peer_table in resolved
    ]
    result = negotiate(
        NegotiationRequest(
            peers=peers, table=table, default_table=default, traffic=request.traffic,
            backend=request.backend or Backend(),
            alternatives=request.alternatives,
        )
    )
    _RESULTS.put(key, result, tables)
    return result
