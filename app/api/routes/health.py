"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app import __version__
from app.web.errors import error_body
from app.web.routing import QossRoute
from app.web.runtime import runtime

__all__ = ["router"]

router = APIRouter(tags=["health"], route_class=QossRoute)


@router.get("/healthz", response_model=None)
async def healthz(request: Request) -> dict[str, Any] | JSONResponse:
    """Ready: the process can take work (503 ``Overloaded`` while every connection it may hold is
    taken and requests wait for one, or every place for a request in flight has been taken for a
    second, so that a load balancer sends elsewhere) and the database
    answers (503 ``DatabaseUnavailable`` otherwise). ``/livez`` says only that the process answers.

    Never queues behind work: not counted by admission control, and the database is asked
    on a connection and a thread of its own, with a short timeout."""
    bound = getattr(request.app.state, "connection_bound", None)  # set by ``qoss serve``'s server
    door = getattr(request.app.state, "door", None)  # the in-flight limit (app.web.admission)
    busy: str | None = bound.not_ready() if bound is not None else None
    busy = busy or (door.not_ready() if door is not None else None)
    if busy:
        return JSONResponse(error_body("Overloaded", f"not ready: {busy}"), status_code=503,
                            headers={"Retry-After": "1"})
    parts = runtime(request)
    if not await parts.health.database_answers():
        return JSONResponse(error_body("DatabaseUnavailable", "the database does not answer"), status_code=503,
                            headers={"Retry-After": "1"})
    return {"status": "ok", "version": __version__,
            "leader": bool(parts.leadership is not None and parts.leadership.leading)}


@router.get("/livez", include_in_schema=False)
async def livez() -> dict[str, str]:
    """The process answers (no dependencies): the trivial endpoint of the benchmarks.

    On the event loop, like ``/healthz``: it never waits for a worker thread behind work."""
    return {"status": "ok"}
