"""One error shape, one status table: ``{"error": <name>, "detail": <what>}``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.adapters.agent.transport import RemoteRefused
from app.domain import errors as e
from app.domain.agent import AgentRejected, PoolExhausted
from app.domain.auth import Forbidden, Unauthenticated
from app.domain.ratelimit import Overloaded, RateLimited

__all__ = ["STATUS", "install_error_handlers", "qoss_error_parts", "status_for"]

log = logging.getLogger("qoss.api")

#: Most specific first: the first class an error is an instance of decides its status.
STATUS: tuple[tuple[type[e.QossError], int], ...] = (
    (Unauthenticated, 401),
    (AgentRejected, 403),
    (RateLimited, 429),
    (Overloaded, 503),
    (PoolExhausted, 503),
    (Forbidden, 403),
    (e.NoFeasibleSuite, 409),
    (e.PeerNoFeasibleSuite, 409),
    (e.PeerTimeout, 504),
    (e.PeerUnreachable, 503),
    (e.PeerRefused, 502),
    (e.PlatformCannot, 409),
    (e.UnsupportedProtection, 409),
    (e.StaleRevision, 409),
    (e.AlreadyExists, 409),
    (e.Conflict, 409),
    (e.NotFound, 404),
    (e.UnsupportedMediaType, 415),
    (e.InvalidInput, 422),
    (e.GatewayUnreachable, 503),
    (e.GatewayRejected, 502),
    (e.TunnelVerificationFailed, 502),
    (e.GatewayError, 502),
)


def status_for(exc: e.QossError) -> int:
    if isinstance(exc, RemoteRefused):  # relayed from the agent's other role
        return exc.status if 400 <= exc.status <= 599 else 502
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(error: str, detail: Any) -> dict[str, Any]:
    return {"error": error, "detail": detail}


def qoss_error_parts(exc: e.QossError) -> tuple[int, dict[str, Any], dict[str, str], str]:
    """A domain error as (status, body, headers, audit detail): one mapping for the handler below
    and the agent's fast path (:mod:`app.api.agent_fast`). A gateway's failure is logged with its
    whole message (the socket, strongSwan's words): the operator's log has what a page may keep
    from its user."""
    if isinstance(exc, e.GatewayError):
        log.warning("%s (%d): %s", type(exc).__name__, status_for(exc), exc.message)
    headers = {}
    if isinstance(exc, e.StaleRevision):
        headers["ETag"] = f'"{exc.current}"'
    if isinstance(exc, Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, RateLimited | Overloaded):
        headers["Retry-After"] = str(exc.retry_after)
    detail = f"AgentRejected: {exc.reason}" if isinstance(exc, AgentRejected) else type(exc).__name__
    return status_for(exc), error_body(type(exc).__name__, exc.detail()), headers, detail


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers: domain errors, validation, HTTP errors, the database, the rest."""

    @app.exception_handler(e.QossError)
    async def _qoss(request: Request, exc: e.QossError) -> JSONResponse:
        status, body, headers, detail = qoss_error_parts(exc)
        request.state.error_name = type(exc).__name__
        if isinstance(exc, AgentRejected):
            request.state.audit_detail = detail
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        request.state.error_name = "ValidationError"
        detail = [
            {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
            for err in exc.errors()
        ]
        return JSONResponse(error_body("ValidationError", detail), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {404: "NotFound", 405: "MethodNotAllowed", 413: "PayloadTooLarge", 428: "PreconditionRequired"}
        name = names.get(exc.status_code, "HTTPError")
        request.state.error_name = name
        return JSONResponse(
            error_body(name, exc.detail),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(PoolTimeout)
    async def _pool_exhausted(request: Request, exc: PoolTimeout) -> JSONResponse:
        request.state.error_name = "DatabaseUnavailable"
        log.warning("no database connection free within the pool timeout")
        return JSONResponse(error_body("DatabaseUnavailable", "the service is busy: no database connection was free"),
                            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(OperationalError)
    async def _database(request: Request, exc: OperationalError) -> JSONResponse:
        request.state.error_name = "DatabaseUnavailable"
        log.error("database unavailable: %s", type(exc.orig).__name__ if exc.orig else "OperationalError")
        return JSONResponse(error_body("DatabaseUnavailable", "the database is unavailable"), status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return JSONResponse(error_body("InternalError", "internal error"), status_code=500)
