"""Negotiation: the cheapest suite meeting every peer's minimums."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from app.api.deps import CacheDep, ReadSessionDep, SettingsDep, reader
from app.api.routing import QossRoute
from app.api.schemas import ErrorOut, NegotiationIn, NegotiationOut
from app.services.negotiation import run_negotiation

__all__ = ["router"]

router = APIRouter(tags=["negotiations"], route_class=QossRoute)
_READ = [Depends(reader)]


@router.post(
    "/negotiations", dependencies=_READ,
    response_class=JSONResponse,
    responses={200: {"model": NegotiationOut}, 409: {"model": ErrorOut}, 404: {"model": ErrorOut},
               422: {"model": ErrorOut}},
)
async def create_negotiation(body: NegotiationIn, session: ReadSessionDep, cache: CacheDep,
                             settings: SettingsDep) -> JSONResponse:
    """Negotiate a suite. 409 ``NoFeasibleSuite`` names every unmet requirement.

    The answer is the engine's own JSON-ready document (documented by ``NegotiationOut``),
    serialised once, without a second validation pass over a document built by our code.
    Runs on the event loop: the work is CPU-bound (a worker thread would only add a hop
    under the GIL), and rating tables come from the in-process cache, so a request
    normally makes no database query; a stored policy costs one indexed read.
    """
    result = run_negotiation(session=session, cache=cache, request=body, default_table=settings.default_table)
    return JSONResponse(result.as_dict())
