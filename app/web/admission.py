"""Overload behaviour: a bounded number of requests in flight, and a health probe that never
queues behind work.

Beyond ``max_in_flight`` requests a process answers ``503 Overloaded`` with ``Retry-After`` at
once, before touching the database: a burst waits in front of the door, never inside on a
lock, and the process is as responsive after it as before. ``/healthz``, ``/livez``,
``/metrics``, the event streams and the packaged static files (the console's and the API
pages': read from the package a chunk at a time, they hold no worker) are neither counted nor
refused; the agent's messages on their fast path are counted like every other request.

A request with a body takes its place once its whole body is in (up to ``max_body_bytes``,
read ahead and handed to the application as it came): a client that sends its body slowly
waits outside, as one sending its head does, until the server's body deadline ends it. A
request leaves the count once its answer's last part is handed to the server: a client that is
slow to read an answer it has been given holds a connection (which the server's send deadline
ends), not a place. While every place has been taken for ``busy_after`` seconds,
:meth:`Door.not_ready` says so, and ``/healthz`` answers 503 so that a load balancer sends
elsewhere. ``/healthz`` asks the database through a connection of its own (no pool), in a
thread of its own, with a short timeout, so it answers even while every worker thread and
pooled connection is busy.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import create_engine, pool, text
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.settings import Settings

__all__ = ["UNCOUNTED_PATHS", "UNCOUNTED_PREFIXES", "AdmissionControl", "Door", "HealthProbe", "uncounted"]

#: Answered whatever the load: they do no work that can queue. The event streams (the API's
#: and the console's) are long-lived by design: they have limits of their own
#: (``max_event_streams``, ``max_event_streams_per_token``) instead.
UNCOUNTED_PATHS = frozenset({"/healthz", "/livez", "/metrics", "/v1/events", "/ui/events"})
#: The packaged static files (``app.ui`` and ``app.api.docs`` mount them here).
UNCOUNTED_PREFIXES = ("/ui/static/", "/docs/static/")
#: Seconds every place must have been taken before the door says it is not ready.
_BUSY_AFTER = 1.0


def _has_body(scope: Scope) -> bool:
    """Whether the request announces a body (a Content-Length above 0, or chunked)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


def uncounted(path: str) -> bool:
    """Whether a request for ``path`` is answered whatever the load, outside the count."""
    return path in UNCOUNTED_PATHS or path.startswith(UNCOUNTED_PREFIXES)


#: Set in a request's scope once the door has counted it.
_ADMITTED = "qoss.admitted"


class Door:
    """The requests inside one process: at most ``settings.max_in_flight``, the rest answered
    ``503 Overloaded`` at once. One per application, shared by :class:`AdmissionControl` and the
    fast paths (:mod:`app.api.agent_fast`, :mod:`app.api.tunnels_fast`), so all count against
    the same limit."""

    def __init__(self, settings: Settings | None = None, *, busy_after: float = _BUSY_AFTER) -> None:
        self.settings = settings
        self.limit = settings.max_in_flight if settings is not None else Settings.model_fields["max_in_flight"].default
        self.busy_after = busy_after
        self.max_body = (settings.max_body_bytes if settings is not None
                         else Settings.model_fields["max_body_bytes"].default)
        self.inside = 0
        self._full_since: float | None = None  # since when every place has been taken
        self._body = json.dumps({"error": "Overloaded",
                                 "detail": "the service is at its limit of requests in flight: retry shortly"}).encode()

    def not_ready(self) -> str | None:
        """Why this process cannot take work now (every place taken for ``busy_after`` seconds), or None."""
        if self._full_since is None or time.monotonic() - self._full_since < self.busy_after:
            return None
        return f"every one of its {self.limit} places for requests in flight is taken"

    def _enter(self) -> None:
        self.inside += 1  # one event loop: no lock needed between the check and the count
        if self.inside >= self.limit and self._full_since is None:
            self._full_since = time.monotonic()

    def _leave(self) -> None:
        self.inside -= 1
        if self.inside < self.limit:
            self._full_since = None

    async def _refuse(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"retry-after", b"1"),
            (b"content-length", str(len(self._body)).encode())]})
        await send({"type": "http.response.body", "body": self._body})

    async def _read_body(self, receive: Receive) -> Receive | None:
        """The request's body read ahead, up to ``max_body`` bytes, as a ``receive`` that replays
        it (and goes on reading past the limit, for the application's own 413); None if the
        client left."""
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # http.disconnect
            messages.append(message)
            size += len(message.get("body", b""))
            if not message.get("more_body", False) or size > self.max_body:
                break
        replay = iter(messages)

        async def replayed() -> Message:
            for message in replay:
                return message
            return await receive()
        return replayed

    async def through(self, scope: Scope, receive: Receive, send: Send, inner: ASGIApp) -> None:
        """``inner`` answers the request if there is room, else 503 Overloaded with Retry-After."""
        if scope.get(_ADMITTED):  # counted already (the fast path handing over to the full stack)
            await inner(scope, receive, send)
            return
        if self.inside >= self.limit:
            await self._refuse(send)
            return
        if _has_body(scope):
            # A whole body before a place, as a whole head before a connection's: a client that
            # sends its body slowly (or never: the server's body deadline ends it) waits outside.
            read = await self._read_body(receive)
            if read is None:
                return  # the client left while sending it
            receive = read
            if self.inside >= self.limit:
                await self._refuse(send)
                return
        self._enter()
        scope[_ADMITTED] = True
        inside = True
        start: Message | None = None

        async def sending(message: Message) -> None:
            # The answer's head is held back until its first part of the body: the server's send
            # waits for a client that does not read before it writes anything, and a request whose
            # answer is whole must not wait there while it still holds a place.
            nonlocal inside, start
            if message["type"] == "http.response.start" and inside:
                start = message
                return
            if inside and message["type"] == "http.response.body" and not message.get("more_body", False):
                inside = False  # the answer is whole: delivering it waits on the client, not on work
                self._leave()
            if start is not None:
                head, start = start, None
                await send(head)
            await send(message)

        try:
            await inner(scope, receive, sending)
        finally:
            if inside:
                self._leave()


class AdmissionControl:
    """Every request but those of ``UNCOUNTED_PATHS`` goes through the application's :class:`Door`."""

    def __init__(self, app: ASGIApp, settings: Settings | None = None, door: Door | None = None) -> None:
        self.app = app
        self.door = door or Door(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or uncounted(scope["path"]):
            await self.app(scope, receive, send)
            return
        await self.door.through(scope, receive, send, self.app)


class HealthProbe:
    """``SELECT 1`` on a connection of its own, in a thread of its own, within ``timeout`` seconds."""

    def __init__(self, database_url: str, timeout: float = 2.0) -> None:
        args: dict[str, Any] = {"timeout": timeout} if database_url.startswith("sqlite") else {"connect_timeout": 2}
        self._engine = create_engine(database_url, poolclass=pool.NullPool, connect_args=args)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qoss-health")
        self.timeout = timeout

    def _ping(self) -> None:
        with self._engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    async def database_answers(self) -> bool:
        """Whether the database answered ``SELECT 1`` in time (never raises)."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(self._thread, self._ping), self.timeout)
        except Exception:  # unreachable, refused, timed out: the answer is "no"
            return False
        return True

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._engine.dispose()
