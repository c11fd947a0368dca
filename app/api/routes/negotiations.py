"""Negotiation: the cheapest suite meeting every peer's minimums."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from app.services.negotiation import run_negotiation
from app.web.deps import ReadUnitDep, SettingsDep, reader
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import NegotiationIn, NegotiationOut, error_responses

__all__ = ["router"]

router = APIRouter(tags=["negotiations"], route_class=QossRoute)
_READ = [Depends(reader)]


@router.post(
    "/negotiations", dependencies=_READ,
    response_class=JSONResponse,
    responses={200: {"model": NegotiationOut}, **error_responses(409, 404, 422, 429)},
)
def create_negotiation(body: NegotiationIn, uow: ReadUnitDep, settings: SettingsDep, request: Request) -> JSONResponse:
    """Negotiate a suite. 409 ``NoFeasibleSuite`` names every unmet requirement.

    The answer is the engine's own JSON-ready document (documented by ``NegotiationOut``),
    serialised once, without a second validation pass over a document built by our code.
    Runs in a worker thread, like every route that may touch the database: rating tables
    usually come from the in-process cache, but a stale cache entry or a stored policy is a
    query, and the event loop never waits on the database.
    """
    principal = getattr(request.state, "principal", None)
    if principal is None or principal.token_id is None:  # anonymous: limited per address and in total
        runtime(request).negotiation_limiter.take(
            f"negotiation:{request.client.host if request.client else ''}", who="this address")
        runtime(request).negotiation_total_limiter.take("negotiation", who="anonymous clients")
    result = run_negotiation(uow=uow, request=body.to_domain(), default_table=settings.default_table,
                             metrics=runtime(request).metrics)
    return JSONResponse(result.as_dict())
