"""Tunnel set-up and teardown, registered to bypass the framework on their happy path.

A tunnel's set-up is one request whose own work (negotiation, charon, one transaction) is a
few milliseconds; FastAPI's dependency solving, routing and middleware stack cost as much
again on the event loop. A ``POST /v1/tunnels`` or ``DELETE /v1/tunnels/{id}`` whose token this
process has checked (within ``token_cache_ttl``, or read again: :func:`app.web.deps.fast_token`)
and holds ``tunnels:write`` (or ``admin``), and (a POST) whose body is a valid tunnel request
within the size limit, is answered by the registry (:mod:`app.web.bypass`) through the route's
own work (:func:`app.api.routes.tunnels.set_up`, ``take_down``), with the same statuses, error
documents, ``x-request-id``, ``Idempotent-Replayed`` and audit record as the full stack gives.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from app.api.routes.tunnels import set_up, take_down
from app.web.body import loads
from app.web.bypass import Answer, Bypass, Call, render
from app.web.schemas import TunnelIn

__all__ = ["TUNNEL_ROUTES"]

_WRITE = frozenset({"tunnels:write"})


def _tunnel_in(body: bytes) -> TunnelIn | None:
    """The tunnel request of a body, or None for anything the full stack should answer."""
    try:
        doc = loads(body)
        return TunnelIn.model_validate(doc) if type(doc) is dict else None
    except (ValueError, ValidationError):
        return None


async def _create(call: Call) -> Answer:
    request = call.request
    request.state.route_status = 201
    assert call.principal is not None
    answer = await set_up(request, call.principal, call.body, request.headers.get("idempotency-key"))
    if answer.replayed:
        return Answer(answer.status, render(answer.body), {"Idempotent-Replayed": "true"})
    return Answer(201, render(answer.body))


async def _delete(call: Call) -> Answer:
    call.request.state.route_status = 204
    await take_down(call.request, call.match[1])
    return Answer(204)


#: A tunnel's create and delete.
TUNNEL_ROUTES = (
    Bypass("POST", re.compile(r"/v1/tunnels"), _create, scopes=_WRITE, parse=_tunnel_in, idempotency_key=True),
    Bypass("DELETE", re.compile(r"/v1/tunnels/([a-z0-9-]{1,40})"), _delete, scopes=_WRITE, idempotency_key=True),
)
