"""Tunnels: negotiated suites made real in strongSwan."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse

from app.domain.errors import NotFound
from app.domain.tunnels import TunnelState
from app.services import reconcile as reconciling
from app.services import tunnels as svc
from app.services.peering import Peering
from app.settings import Settings
from app.web.deps import (
    Principal,
    ReadUnitDep,
    SettingsDep,
    TunnelIdPath,
    UnitDep,
    ViciDep,
    in_unit,
    require,
)
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import TunnelIn, error_responses

__all__ = ["router", "set_up", "take_down"]

router = APIRouter(tags=["tunnels"], route_class=QossRoute)
_TUNNELS_READ = [Depends(require("tunnels:read"))]
_TUNNELS_WRITE = [Depends(require("tunnels:write"))]

TunnelId = TunnelIdPath
_ERRORS = error_responses(404, 409, 422, 502, 503)


async def set_up(request: Request, principal: Principal, body: TunnelIn, idempotency_key: str | None) -> svc.Answer:
    """A tunnel request's work, for this route and its fast path (:mod:`app.api.tunnels_fast`): the
    token's rate, then negotiation, charon and the records in one worker thread (:func:`in_unit`)."""
    spec = body.to_domain()
    state = runtime(request)  # read here, not as dependencies: each costs FastAPI's solving per request
    state.tunnel_limiter.take(principal.token_id or "")
    settings: Settings = state.settings
    if spec.responder is not None and "@" in spec.responder:  # GATEWAY@PEER: another qoss's gateway
        peering = _peering(request)
        record = await in_unit(request, lambda uow, reads: peering.request_tunnel(uow=uow, reads=reads, request=spec))
        return svc.Answer(201, svc.answer_of(record))
    return await in_unit(request, lambda uow, reads: svc.request_tunnel(
        uow=uow, units=state.units, vici=state.vici_factory, request=spec,
        default_table=settings.default_table, allowed_networks=settings.gateway_networks,
        token_id=principal.token_id or "", idempotency_key=idempotency_key,
        fingerprint_key=state.idempotency_key, metrics=state.metrics,
        lease=settings.idempotency_lease, reads=reads,
        reports=state.sa_events if settings.sa_reports else None))


async def take_down(request: Request, tunnel_id: str) -> None:
    """A tunnel's delete, for this route and its fast path: one worker thread (:func:`in_unit`)."""
    parts = runtime(request)
    vici, peering = parts.vici_factory, parts.peering
    if peering is not None:  # a peered tunnel's other end is told; any other goes as below
        await in_unit(request, lambda uow, reads: peering.delete_tunnel(uow=uow, reads=reads, tunnel_id=tunnel_id))
        return
    await in_unit(request, lambda uow, reads: svc.delete_tunnel(uow=uow, vici=vici, tunnel_id=tunnel_id, reads=reads))


def _peering(request: Request) -> Peering:
    peering = runtime(request).peering
    if peering is None:
        raise NotFound("this service has no peers (QOSS_PEER_NAME is not set): GATEWAY@PEER names none")
    return peering


@router.post("/tunnels", status_code=201, responses=_ERRORS)
async def create_tunnel(
    body: TunnelIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("tunnels:write"))],
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")] = None,
) -> Any:
    """Negotiate, load both charons (fresh PSK, never returned), bring up, verify what strongSwan
    installed (charon's report of the SAs coming up, or list-sas).

    With ``peer`` instead of ``responder`` the far end is an unmanaged IKEv2 gateway: only
    the initiator is loaded (with the peer's write-only PSK: never stored, logged or
    returned) and verified; the peer's address must be inside the allowed networks.

    409: nothing feasible (nothing loaded), or the same ``Idempotency-Key`` is in flight.
    503: a charon is unreachable. 502: strongSwan refused or negotiated something else.
    On any failure nothing stays loaded. With ``Idempotency-Key`` a retry returns the first
    answer instead of making a second tunnel; if the process running the first attempt died,
    a retry after ``QOSS_IDEMPOTENCY_LEASE`` seconds runs it again (or answers the tunnel that
    attempt made).
    """
    answer = await set_up(request, principal, body, idempotency_key)
    if answer.replayed:
        return JSONResponse(answer.body, status_code=answer.status, headers={"Idempotent-Replayed": "true"})
    return answer.body


@router.get("/tunnels", dependencies=_TUNNELS_READ, responses=_ERRORS, response_model=list[dict[str, Any]])
def list_tunnels(
    request: Request,
    uow: ReadUnitDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many tunnels")] = 100,
    cursor: Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$",
                                        description="where the page before left off (from its Link header)")] = None,
    state: Annotated[TunnelState | None, Query(description="only tunnels in this state")] = None,
) -> Response:
    """The tunnels qoss made, oldest first, a page at a time. When there are more, the answer has
    a ``Link: <...>; rel="next"`` header with the next page's address (same ``limit`` and
    ``state``); a page without it is the last. Tunnels made or torn down meanwhile never make a
    page repeat or skip one."""
    page = svc.page_tunnels(uow=uow, limit=limit, cursor=cursor, state=state)
    headers = {}
    if page.next_cursor is not None:
        query = {"limit": str(limit), **({"state": state.value} if state is not None else {}),
                 "cursor": page.next_cursor}
        headers["Link"] = f'<{request.url.path}?{urlencode(query)}>; rel="next"'
    return JSONResponse([t.as_dict() for t in page.records], headers=headers)


@router.get("/tunnels/{tunnel_id}", dependencies=_TUNNELS_READ, responses=_ERRORS)
def get_tunnel(tunnel_id: TunnelId, uow: ReadUnitDep, vici: ViciDep) -> dict[str, Any]:
    """The tunnel and what charon says of it now (state, algorithms, bytes in/out)."""
    return svc.tunnel_status(uow=uow, vici=vici, tunnel_id=tunnel_id)


@router.delete("/tunnels/{tunnel_id}", dependencies=_TUNNELS_WRITE, status_code=204, responses=_ERRORS)
async def delete_tunnel(tunnel_id: TunnelId, request: Request) -> Response:
    """Terminate and unload conn and secret on both ends."""
    await take_down(request, tunnel_id)
    return Response(status_code=204)


@router.post("/tunnels/reconcile", dependencies=_TUNNELS_WRITE, responses=_ERRORS)
def reconcile_tunnels(uow: UnitDep, vici: ViciDep, settings: SettingsDep) -> dict[str, Any]:
    """Make records and charons agree (see the README): restore, mark failed, remove orphans."""
    return reconciling.reconcile(uow=uow, vici=vici, default_table=settings.default_table).as_dict()
