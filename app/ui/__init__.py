"""The admin console at ``/ui``: server-rendered pages (Jinja2, autoescaped), htmx for partial
updates, over the same services and the same request unit of work as the REST API.

:func:`install` is all the application does to have it: its routes and its static files.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.ui.pages import not_found, routers
from app.ui.render import SECURITY_HEADERS

__all__ = ["install"]


class _Headers:
    """Static files with the console's security headers (and a day of caching)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": [*message.get("headers", []), *extra,
                                                  (b"cache-control", b"public, max-age=86400")]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install(app: FastAPI) -> None:
    """Mount the console on ``app``: pages under ``/ui``, static files under ``/ui/static``."""
    static = StaticFiles(directory=str(files("app.ui") / "static"))
    app.mount("/ui/static", _Headers(static), name="ui-static")
    for router in routers:
        app.include_router(router)
    app.include_router(not_found.router)  # last: any other path under /ui is a 404 page
