"""The algorithm catalogue."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from app.domain.algorithms import CATALOGUE, Kind, Protocol, lookup
from app.domain.errors import NotFound, UnknownAlgorithm
from app.web.deps import reader
from app.web.routing import QossRoute
from app.web.schemas import AlgorithmOut

__all__ = ["router"]

router = APIRouter(tags=["algorithms"], route_class=QossRoute)
_READ = [Depends(reader)]


@router.get("/algorithms", dependencies=_READ, response_model=list[AlgorithmOut])
def list_algorithms(
    kind: Annotated[Kind | None, Query()] = None, protocol: Annotated[Protocol | None, Query()] = None
) -> list[dict[str, Any]]:
    """Every keyword strongSwan 5.9 negotiates, in tie-break order."""
    return [
        a.as_dict()
        for a in CATALOGUE.values()
        if (kind is None or a.kind is kind) and (protocol is None or a.usable_in(protocol))
    ]


@router.get("/algorithms/{keyword}", dependencies=_READ, response_model=AlgorithmOut, responses={404: {}})
def get_algorithm(keyword: Annotated[str, Path(max_length=64)]) -> dict[str, Any]:
    """One algorithm by keyword or alias; unknown keywords answer with close matches."""
    try:
        return lookup(keyword).as_dict()
    except UnknownAlgorithm as exc:
        raise NotFound(exc.message) from exc
