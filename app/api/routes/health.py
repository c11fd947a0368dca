"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import text

from app import __version__
from app.api.deps import ReadSessionDep
from app.api.routing import QossRoute

__all__ = ["router"]

router = APIRouter(tags=["health"], route_class=QossRoute)


@router.get("/healthz")
def healthz(session: ReadSessionDep) -> dict[str, Any]:
    """Up, and the database answers."""
    session.execute(text("SELECT 1"))
    return {"status": "ok", "version": __version__}


@router.get("/livez", include_in_schema=False)
def livez() -> dict[str, str]:
    """The process answers (no dependencies): the trivial endpoint of the benchmarks."""
    return {"status": "ok"}
