"""Overload behaviour: a bounded number of requests in flight, and a health probe that never
queues behind work.

Beyond ``max_in_flight`` requests a process answers ``503 Overloaded`` with ``Retry-After`` at
once, before reading the body or touching the database: a burst waits in front of the door,
never inside on a lock, and the process is as responsive after it as before. ``/healthz``,
``/livez`` and ``/metrics`` are neither counted nor refused. ``/healthz`` asks the database through a
connection of its own (no pool), in a thread of its own, with a short timeout, so it answers
even while every worker thread and pooled connection is busy.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import create_engine, pool, text
from starlette.types import ASGIApp, Receive, Scope, Send

from app.settings import Settings

__all__ = ["UNCOUNTED_PATHS", "AdmissionControl", "HealthProbe"]

#: Answered whatever the load: they do no work that can queue. The event stream is long-lived
#: by design: it has a limit of its own (``max_event_streams``) instead.
UNCOUNTED_PATHS = frozenset({"/healthz", "/livez", "/metrics", "/v1/events"})


class AdmissionControl:
    """At most ``settings.max_in_flight`` requests in the application at once; the rest 503."""

    def __init__(self, app: ASGIApp, settings: Settings | None = None) -> None:
        self.app = app
        self.settings = settings
        self.in_flight = 0
        self._body = json.dumps({"error": "Overloaded",
                                 "detail": "the service is at its limit of requests in flight: retry shortly"}).encode()

    def _limit(self, scope: Scope) -> int:
        settings: Settings | None = getattr(scope["app"].state, "settings", None) or self.settings
        return settings.max_in_flight if settings is not None else Settings.model_fields["max_in_flight"].default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self._limit(scope):
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", b"1"),
                (b"content-length", str(len(self._body)).encode())]})
            await send({"type": "http.response.body", "body": self._body})
            return
        self.in_flight += 1  # one event loop: no lock needed between the check and the count
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


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
