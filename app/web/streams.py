"""Following the event log as Server-Sent Events, for the API's ``GET /v1/events`` and the
console's ``GET /ui/events`` alike: one stream per follower, its credential checked again at
every look at the log, its place in the process's limits given back however it ends."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.domain.errors import InvalidInput
from app.services.events import FollowerGone, StreamFollower, events_after, last_event_id, stream_scopes
from app.web.deps import MAX_DB_INT
from app.web.runtime import runtime

__all__ = ["KEEPALIVE", "POLL", "SSE", "follow"]

log = logging.getLogger("qoss.events")

#: The media type of a Server-Sent Events stream.
SSE = "text/event-stream"
#: Seconds between looks at the database while nothing happens, and between keep-alive comments.
POLL, KEEPALIVE = 0.5, 15.0


def _frame(event: dict[str, Any]) -> str:
    data = json.dumps({k: event[k] for k in ("id", "at", "kind", "subject", "data")}, separators=(",", ":"))
    return f"id: {event['id']}\nevent: {event['kind']}\ndata: {data}\n\n"


class _EventStream(StreamingResponse):
    """A stream that gives its place back however it ends: finished, failed, or never begun
    (a client gone before the first byte)."""

    def __init__(self, frames: AsyncIterator[str], give_back: Callable[[], None]) -> None:
        super().__init__(frames, media_type=SSE, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self._give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._give_back()


async def follow(request: Request, follower: StreamFollower, start: int | None) -> StreamingResponse:
    """The stream of the events ``follower`` may see after event ``start`` (None: from the newest
    on), shared by ``GET /v1/events`` and the console's ``GET /ui/events``.

    At every look at the log (every ``POLL`` seconds at most) the follower is checked again
    (:func:`app.services.events.stream_scopes`): once its token is revoked or expired, or its
    console session ended, the stream ends with a comment saying why, and its place is free.

    Raises:
        TooManyStreams: the token follows ``max_event_streams_per_token`` streams already (429).
        Overloaded: the service follows ``max_event_streams`` streams already (503).
        InvalidInput: ``start`` is no event id of this service.
    """
    parts = runtime(request)
    settings = parts.settings
    limits = {"total": settings.max_event_streams, "per_token": settings.max_event_streams_per_token}
    slots = parts.event_streams
    slots.check(follower.token_id, **limits)
    units = parts.read_units
    app_state = request.app.state

    def read(last: int) -> list[dict[str, Any]]:
        with units() as uow:
            return events_after(uow, last, stream_scopes(uow, follower))

    def newest() -> int:
        with units() as uow:
            return last_event_id(uow)

    if start is not None and start > MAX_DB_INT:
        raise InvalidInput(f"Last-Event-ID {start} is not an event id of this service")
    if start is None:
        start = await anyio.to_thread.run_sync(newest)

    async def frames(last: int) -> AsyncIterator[str]:
        quiet_since = time.monotonic()
        ends = quiet_since + settings.event_stream_seconds
        yield f"retry: 2000\n: following events after {last}\n\n"
        while time.monotonic() < ends and not app_state.draining and not await request.is_disconnected():
            try:
                batch = await anyio.to_thread.run_sync(read, last)
            except FollowerGone as gone:  # revoked, expired, signed out: no more frames for it
                yield f": stream ended: {gone.reason}\n\n"
                return
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

    give_back = slots.take(follower.token_id, **limits)  # no await since: nothing can end before it is given back
    return _EventStream(frames(start), give_back)
