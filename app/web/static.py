"""Packaged static files (the console's, the API pages') served with headers of their own."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["WithHeaders"]


class WithHeaders:
    """An ASGI app (a ``StaticFiles``) whose every answer also carries ``headers`` and a day of
    caching: the files are the package's own, and change only with a new version."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str]) -> None:
        self.app = app
        self.extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.extra.append((b"cache-control", b"public, max-age=86400"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
