"""The FastAPI application: resources live in the lifespan, never at import."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from app import __version__
from app.adapters.db.engine import make_engine, make_session_factory
from app.api.errors import error_body, install_error_handlers
from app.api.routes import algorithms, health, negotiations, policies, ratings
from app.services.ratings import TableCache
from app.settings import Settings

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application. The database must already be migrated (``qoss db upgrade``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings or Settings()
        engine = make_engine(resolved.database_url)
        app.state.settings = resolved
        app.state.engine = engine
        app.state.session_factory = make_session_factory(engine)
        app.state.table_cache = TableCache()
        try:
            yield
        finally:
            engine.dispose()

    app = FastAPI(
        title="qoss",
        version=__version__,
        description="Quality-of-Security-Service policy negotiation for IPsec (ESAF): the cheapest "
        "strongSwan suite that meets every peer's minimum security levels.",
        lifespan=lifespan,
    )
    install_error_handlers(app)

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        limit = (settings or request.app.state.settings).max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return JSONResponse(error_body("PayloadTooLarge", f"request bodies are limited to {limit} bytes"),
                                status_code=413)
        return await call_next(request)

    app.include_router(health.router)
    for module in (algorithms, ratings, policies, negotiations):
        app.include_router(module.router, prefix="/v1")
    return app
