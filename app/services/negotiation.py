"""The negotiation use case: resolve policies and tables, run the pure engine.

Its input is :class:`app.domain.requests.NegotiationSpec`, the value every edge makes of the
one negotiation document (:class:`app.web.schemas.NegotiationIn`: ``POST /v1/negotiations``,
``qoss negotiate``, the console's playground) and the tunnels and the agent build themselves.
"""

from __future__ import annotations

from app.domain.negotiation import Backend, NegotiationRequest, NegotiationResult, Peer, negotiate
from app.domain.policies import Levels, Policy, keyword_set, parse_objectives
from app.domain.ports import NO_METRICS, Metrics, UnitOfWork, error_label
from app.domain.ratings import RatingTable
from app.domain.requests import NegotiationSpec, PeerSpec

__all__ = ["run_negotiation"]


def run_negotiation(
    *, uow: UnitOfWork, request: NegotiationSpec, default_table: str, metrics: Metrics = NO_METRICS,
    check: bool = False,
) -> NegotiationResult:
    """Resolve the request's policies and tables, then negotiate.

    Tables are read as the process read them lately (:meth:`~app.domain.ports.RatingTableStore.recent`;
    ``check``: each table's revision read now, as after an edit). The engine is a pure function
    of the request, its tables and the named policies' contents, so the result of the same inputs
    may be reused (:meth:`~app.domain.ports.RatingTableStore.memo`): callers must not change a
    result.

    Raises:
        NotFound: a named policy or rating table does not exist.
        InvalidPolicy: an unknown objective or algorithm keyword.
        NoFeasibleSuite: nothing meets the minimums (409).

    ``metrics``: the negotiation is counted by outcome (``qoss_negotiations_total``: ``chosen``
    or the error's name).
    """
    try:
        result = _run_negotiation(uow=uow, request=request, default_table=default_table, check=check)
    except Exception as exc:
        metrics.count("qoss_negotiations_total", outcome=error_label(exc))
        raise
    metrics.count("qoss_negotiations_total", outcome="chosen")
    return result


def _run_negotiation(*, uow: UnitOfWork, request: NegotiationSpec, default_table: str,
                     check: bool) -> NegotiationResult:
    tables_of = uow.tables

    def read(name: str) -> RatingTable:
        return tables_of.recent(name, check=check)

    default = read(default_table)
    table = read(request.rating_table) if request.rating_table else default
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
        resolved.append((p, policy, read(policy.rating_table) if policy.rating_table else table))
    tables = (default, table, *(peer_table for _, _, peer_table in resolved))
    # The same inputs were checked (keywords included) when a kept result was made.
    return tables_of.memo((request, tuple(stored_policies)), tables,
                          lambda: _negotiate(request, resolved, table=table, default=default))


def _negotiate(request: NegotiationSpec, resolved: list[tuple[PeerSpec, Policy, RatingTable]], *,
               table: RatingTable, default: RatingTable) -> NegotiationResult:
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
    return negotiate(
        NegotiationRequest(
            peers=peers, table=table, default_table=default, traffic=request.traffic,
            backend=request.backend or Backend(),
            alternatives=request.alternatives,
        )
    )
