"""Tunnels: negotiated suites made real in strongSwan."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from fastapi.responses import JSONResponse

from app.api.deps import CacheDep, Principal, ReadSessionDep, SessionDep, SettingsDep, ViciDep, require
from app.api.routing import QossRoute
from app.api.schemas import ErrorOut
from app.services import idempotency as idem
from app.services import tunnels as svc

__all__ = ["router"]

router = APIRouter(tags=["tunnels"], route_class=QossRoute)
_TUNNELS_READ = [Depends(require("tunnels:read"))]
_TUNNELS_WRITE = [Depends(require("tunnels:write"))]

TunnelId = Annotated[str, Path(min_length=1, max_length=40, pattern=r"^[a-z0-9-]+$")]
_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut}, 409: {"model": ErrorOut}, 422: {"model": ErrorOut},
    502: {"model": ErrorOut}, 503: {"model": ErrorOut},
}


@router.post("/tunnels", status_code=201, responses=_ERRORS)
def create_tunnel(
    body: svc.TunnelIn,
    request: Request,
    session: SessionDep,
    cache: CacheDep,
    vici: ViciDep,
    settings: SettingsDep,
    principal: Annotated[Principal, Depends(require("tunnels:write"))],
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")] = None,
) -> Any:
    """Negotiate, load both charons (fresh PSK, never returned), bring up, verify with list-sas.

    With ``peer`` instead of ``responder`` the far end is an unmanaged IKEv2 gateway: only
    the initiator is loaded (with the peer's write-only PSK: never stored, logged or
    returned) and verified; the peer's address must be inside the allowed networks.

    409: nothing feasible (nothing loaded), or the same ``Idempotency-Key`` is in flight.
    503: a charon is unreachable. 502: strongSwan refused or negotiated something else.
    On any failure nothing stays loaded. With ``Idempotency-Key`` a retry returns the first
    answer instead of making a second tunnel.
    """
    factory = request.app.state.session_factory
    token_id = principal.token_id or ""
    request.app.state.tunnel_limiter.take(token_id)
    if idempotency_key is not None:
        stored = idem.begin(factory, token_id=token_id, key=idempotency_key,
                            digest=idem.fingerprint(body, key=request.app.state.idempotency_key))
        if stored is not None:
            return JSONResponse(stored.body, status_code=stored.status, headers={"Idempotent-Replayed": "true"})
    try:
        record = svc.create_tunnel(session=session, cache=cache, vici=vici, request=body,
                                   default_table=settings.default_table, allowed_networks=settings.gateway_networks)
        out = record.as_dict()
        out["ike"] = record.negotiation.get("ike")
        out["notes"] = record.negotiation.get("notes")
        session.commit()
    except BaseException:
        session.rollback()  # release this request's write lock before releasing the key
        if idempotency_key is not None:
            idem.abandon(factory, token_id=token_id, key=idempotency_key)
        raise
    if idempotency_key is not None:
        idem.complete(factory, token_id=token_id, key=idempotency_key, status=201, body=out)
    return out


@router.get("/tunnels", dependencies=_TUNNELS_READ)
def list_tunnels(session: ReadSessionDep) -> list[dict[str, Any]]:
    """Every tunnel qoss made."""
    return [t.as_dict() for t in svc.list_tunnels(session=session)]


@router.get("/tunnels/{tunnel_id}", dependencies=_TUNNELS_READ, responses=_ERRORS)
def get_tunnel(tunnel_id: TunnelId, session: ReadSessionDep, vici: ViciDep) -> dict[str, Any]:
    """The tunnel and what charon says of it now (state, algorithms, bytes in/out)."""
    return svc.tunnel_status(session=session, vici=vici, tunnel_id=tunnel_id)


@router.delete("/tunnels/{tunnel_id}", dependencies=_TUNNELS_WRITE, status_code=204, responses=_ERRORS)
def delete_tunnel(tunnel_id: TunnelId, session: SessionDep, vici: ViciDep) -> Response:
    """Terminate and unload conn and secret on both ends."""
    svc.delete_tunnel(session=session, vici=vici, tunnel_id=tunnel_id)
    return Response(status_code=204)


@router.post("/tunnels/reconcile", dependencies=_TUNNELS_WRITE, responses=_ERRORS)
def reconcile_tunnels(session: SessionDep, cache: CacheDep, vici: ViciDep, settings: SettingsDep) -> dict[str, Any]:
    """Make records and charons agree (see the README): restore, mark failed, remove orphans."""
    return svc.reconcile(session=session, cache=cache, vici=vici, default_table=settings.default_table).as_dict()
