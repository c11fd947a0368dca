"""``GET /metrics``: the Prometheus exposition, for a token with the ``metrics:read`` scope.

It answers whatever the load: admission control neither counts nor refuses it
(:data:`app.web.admission.UNCOUNTED_PATHS`), and the token check, the tunnel counts and, in
multi-process mode, the reading of every process's files run on a database connection and a
thread of its own (:class:`app.adapters.metrics.ScrapeReader`), never on the event loop and
never behind the requests that hold the worker threads and the pool.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session

from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.adapters.metrics import CONTENT_TYPE, WriteGateCounts, exposition
from app.domain.auth import check_scopes
from app.services.auth import authenticate_source
from app.web.deps import Bearer, Principal
from app.web.errors import error_body
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import error_responses

__all__ = ["SCOPE", "router"]

router = APIRouter(tags=["metrics"], route_class=QossRoute)

#: The scope a scraper's token needs (or ``admin``).
SCOPE = "metrics:read"


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {CONTENT_TYPE: {}}, "description": "The Prometheus text exposition (format 0.0.4)"},
    **error_responses(401, 403, 503)})
async def metrics(request: Request, _bearer: Bearer,
                  authorization: Annotated[str | None, Header(include_in_schema=False)] = None) -> Response:
    """Every metric of this process (every process's, summed, in multi-process mode) and the
    tunnel records by state and gateway. 401 without a valid token, 403 without ``metrics:read``;
    503 ``DatabaseUnavailable`` when the token cannot be checked in time."""
    parts = runtime(request)
    reader, counted = parts.scrape_reader, parts.metrics
    presented = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
    source = request.client.host if request.client else ""
    failures = parts.auth_failures if authorization is not None else None

    def scrape(session: Session) -> bytes:
        record = authenticate_source(uow=SqlUnitOfWork(session), presented=presented, source=source,
                                     failures=failures)
        request.state.principal = Principal(record.id, record.name, record.scopes)
        check_scopes(record, SCOPE)
        return exposition(counted.registry, [reader.tunnel_counts(session), WriteGateCounts(parts.write_groups)])

    try:
        body: bytes = await asyncio.wait_for(asyncio.wrap_future(reader.submit(scrape)), reader.timeout * 2)
    except TimeoutError:
        return JSONResponse(error_body("DatabaseUnavailable", "the database does not answer"), status_code=503,
                            headers={"Retry-After": "1"})
    return Response(body, media_type=CONTENT_TYPE)
