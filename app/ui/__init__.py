"""The admin console at ``/ui``: server-rendered pages (Jinja2, autoescaped), htmx for partial
updates, over the same services and the same request unit of work as the REST API.

:func:`install` is all the application does to have it: its routes and its static files.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from app.ui.pages import not_found, routers
from app.ui.render import SECURITY_HEADERS
from app.web.static import WithHeaders

__all__ = ["install"]


def install(app: FastAPI) -> None:
    """Mount the console on ``app``: pages under ``/ui``, static files under ``/ui/static``."""
    static = StaticFiles(directory=str(files("app.ui") / "static"))
    app.mount("/ui/static", WithHeaders(static, SECURITY_HEADERS), name="ui-static")
    for router in routers:
        app.include_router(router)
    app.include_router(not_found.router)  # last: any other path under /ui is a 404 page
