"""Why a negotiation did not choose an algorithm ("why not X?"): the negotiation is run as
``POST /v1/negotiations`` runs it (:func:`app.services.negotiation.run_negotiation`), and the
domain reads the answer from its result (:mod:`app.domain.negotiation.why_not`)."""

from __future__ import annotations

import dataclasses

from app.domain.algorithms import Kind, lookup
from app.domain.negotiation import NegotiationResult
from app.domain.negotiation.why_not import EVERY_SUITE, WhyNot, explain
from app.domain.ports import UnitOfWork
from app.domain.ratings import RatingTable
from app.domain.requests import NegotiationSpec
from app.services.negotiation import run_negotiation

__all__ = ["WhyNot", "why_not"]


def why_not(*, uow: UnitOfWork, request: NegotiationSpec, default_table: str, keyword: str) -> WhyNot:
    """Why the negotiation of ``request`` did not choose ``keyword`` (or that it did).

    Raises:
        UnknownAlgorithm: ``keyword`` is not in the catalogue (422).
        NotFound, InvalidPolicy: as :func:`run_negotiation`.
        NoFeasibleSuite: nothing at all is feasible (409): then nothing was chosen over X.
    """
    lookup(keyword)
    result = run_negotiation(uow=uow, request=request, default_table=default_table)

    def pricing(kind: Kind) -> RatingTable:
        """The negotiation's table, or the default one where it rates no such kind."""
        table = uow.tables.recent(result.tables.get("negotiation", default_table))
        return table if table.covers(kind) else uow.tables.recent(result.tables.get("default", default_table))

    def every() -> NegotiationResult:
        return run_negotiation(uow=uow, request=dataclasses.replace(request, alternatives=EVERY_SUITE),
                               default_table=default_table)

    return explain(result, keyword, pricing=pricing, every=every)
