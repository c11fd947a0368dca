"""Negotiation: the cheapest suite meeting every peer's minimums."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.deps import CacheDep, SessionDep, SettingsDep
from app.api.schemas import ErrorOut, NegotiationIn, NegotiationOut
from app.services.negotiation import run_negotiation

__all__ = ["router"]

router = APIRouter(tags=["negotiations"])


@router.post(
    "/negotiations",
    response_model=NegotiationOut,
    responses={409: {"model": ErrorOut}, 404: {"model": ErrorOut}, 422: {"model": ErrorOut}},
)
def create_negotiation(body: NegotiationIn, session: SessionDep, cache: CacheDep,
                       settings: SettingsDep) -> dict[str, Any]:
    """Negotiate a suite. 409 ``NoFeasibleSuite`` names every unmet requirement."""
    result = run_negotiation(session=session, cache=cache, request=body, default_table=settings.default_table)
    return result.as_dict()
