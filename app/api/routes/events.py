"""Live events as Server-Sent Events: ``GET /v1/events``.

Every change qoss makes has its event, written in the change's own transaction: tunnels
created, deleted, changing state or moved to another suite, rating-table and policy
revisions, audit entries. A client sees the events its token's scopes allow (tunnel events:
``tunnels:read``; audit entries: ``audit:read``; revisions: any token; ``admin``: all). Each
event has an id; a client that reconnects with ``Last-Event-ID`` (or ``?after=``) gets every
event after it from the database, so nothing is missed across reconnects, restarts or
replicas (they share the database). Without either the stream starts at the newest event.

A stream lasts while its token may read it: within a second of the token's revocation or
expiry (or, for the console's stream, its session's sign-out) it ends with a comment
``: stream ended: <why>``, and its place is free. A process follows ``max_event_streams``
streams at most (503 beyond), one token ``max_event_streams_per_token`` (429 beyond).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse

from app.services.events import StreamFollower
from app.web.deps import MAX_DB_INT, Principal, require_token
from app.web.routing import QossRoute
from app.web.schemas import error_responses
from app.web.streams import SSE, follow

__all__ = ["router"]

router = APIRouter(tags=["events"], route_class=QossRoute)

#: One Server-Sent Event as the stream carries it: its id, its kind, and its JSON as text.
_EVENT_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"type": "string"},
    "data": {"type": "string", "description": 'JSON: {"id", "at", "kind", "subject", "data"}'}}}


@router.get("/events", responses={200: {"content": {SSE: {"schema": _EVENT_SCHEMA}},
                                        "description": "Server-Sent Events, one per change"},
                                  **error_responses(401, 422, 429, 503)})
async def stream_events(
    request: Request,
    principal: Annotated[Principal, Depends(require_token)],
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID", max_length=12,
                                                       pattern=r"^[0-9]+$")] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_DB_INT, description="events after this id")] = None,
) -> StreamingResponse:
    """Follow what happens, as Server-Sent Events (``id``, ``event`` = kind, ``data`` = JSON).

    The stream ends (after a comment saying why) within a second of the token's revocation or
    expiry; a token follows at most ``max_event_streams_per_token`` streams at once (429).
    """
    start = after if after is not None else int(last_event_id_header) if last_event_id_header else None
    assert principal.token_id is not None  # require_token: a valid token, never anonymous
    return await follow(request, StreamFollower(principal.token_id), start)


