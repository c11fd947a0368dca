"""Live events as Server-Sent Events: ``GET /v1/events``.

Every change qoss makes has its event, written in the change's own transaction: tunnels
created, deleted, changing state or moved to another suite, rating-table and policy
revisions, audit entries. A client sees the events its token's scopes allow (tunnel events:
``tunnels:read``; audit entries: ``audit:read``; revisions: any token; ``admin``: all). Each
event has an id; a client that reconnects with ``Last-Event-ID`` (or ``?after=``) gets every
event after it from the database, so nothing is missed across reconnects, restarts or
replicas (they share the database). Without either the stream starts at the newest event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse

from app.domain.errors import InvalidInput
from app.domain.ratelimit import Overloaded
from app.services.events import events_after, last_event_id, visible_scopes
from app.web.deps import MAX_DB_INT, Principal, require_token
from app.web.routing import QossRoute
from app.web.schemas import ErrorOut

__all__ = ["follow", "router"]

router = APIRouter(tags=["events"], route_class=QossRoute)
log = logging.getLogger("qoss.events")

_SSE = "text/event-stream"
#: Seconds between looks at the database while nothing happens, and between keep-alive comments.
POLL, KEEPALIVE = 0.5, 15.0


def _frame(event: dict[str, Any]) -> str:
    data = json.dumps({k: event[k] for k in ("id", "at", "kind", "subject", "data")}, separators=(",", ":"))
    return f"id: {event['id']}\nevent: {event['kind']}\ndata: {data}\n\n"


#: One Server-Sent Event as the stream carries it: its id, its kind, and its JSON as text.
_EVENT_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"type": "string"},
    "data": {"type": "string", "description": 'JSON: {"id", "at", "kind", "subject", "data"}'}}}


@router.get("/events", responses={200: {"content": {_SSE: {"schema": _EVENT_SCHEMA}},
                                        "description": "Server-Sent Events, one per change"},
                                  401: {"model": ErrorOut}, 422: {"model": ErrorOut}, 503: {"model": ErrorOut}})
async def stream_events(
    request: Request,
    principal: Annotated[Principal, Depends(require_token)],
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID", max_length=12,
                                                       pattern=r"^[0-9]+$")] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_DB_INT, description="events after this id")] = None,
) -> StreamingResponse:
    """Follow what happens, as Server-Sent Events (``id``, ``event`` = kind, ``data`` = JSON)."""
    start = after if after is not None else int(last_event_id_header) if last_event_id_header else None
    return await follow(request, visible_scopes(principal.scopes), start)


async def follow(request: Request, scopes: frozenset[str] | None, start: int | None) -> StreamingResponse:
    """The stream of the events ``scopes`` may see after event ``start`` (None: from the newest
    on), shared by ``GET /v1/events`` and the console's ``GET /ui/events``.

    Raises:
        Overloaded: the service follows ``max_event_streams`` streams already (503).
        InvalidInput: ``start`` is no event id of this service.
    """
    state = request.app.state
    if state.event_streams >= state.settings.max_event_streams:
        raise Overloaded("the service follows as many event streams as it may: retry shortly")
    units = state.read_units

    def read(last: int) -> list[dict[str, Any]]:
        with units() as uow:
            return events_after(uow, last, scopes)

    def newest() -> int:
        with units() as uow:
            return last_event_id(uow)

    if start is not None and start > MAX_DB_INT:
        raise InvalidInput(f"Last-Event-ID {start} is not an event id of this service")
    if start is None:
        start = await anyio.to_thread.run_sync(newest)

    async def frames() -> AsyncIterator[str]:
        last, quiet_since = start, time.monotonic()
        ends = quiet_since + state.settings.event_stream_seconds
        state.event_streams += 1
        try:
            yield f"retry: 2000\n: following events after {last}\n\n"
            while time.monotonic() < ends and not state.draining and not await request.is_disconnected():
                try:
                    batch = await anyio.to_thread.run_sync(read, last)
                except Exception as exc:  # the database went away: end cleanly; the client resumes
                    log.warning("event stream ended: %s", type(exc).__name__)
                    return
                for event in batch:
                    yield _frame(event)
                    last = int(event["id"])
                if batch:
                    quiet_since = time.monotonic()
                    continue
                if time.monotonic() - quiet_since > KEEPALIVE:
                    yield ": keep-alive\n\n"
                    quiet_since = time.monotonic()
                await asyncio.sleep(min(POLL, max(0.0, ends - time.monotonic())))  # ends on time
        finally:
            state.event_streams -= 1

    return StreamingResponse(frames(), media_type=_SSE, headers={"Cache-Control": "no-store",
                                                                 "X-Accel-Buffering": "no"})
