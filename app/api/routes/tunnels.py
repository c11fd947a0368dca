"""Tunnels: negotiated suites made real in strongSwan."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response

from app.api.deps import CacheDep, ReadSessionDep, SessionDep, SettingsDep, ViciDep, require
from app.api.schemas import ErrorOut
from app.services import tunnels as svc

__all__ = ["router"]

router = APIRouter(tags=["tunnels"])
_TUNNELS_READ = [Depends(require("tunnels:read"))]
_TUNNELS_WRITE = [Depends(require("tunnels:write"))]

TunnelId = Annotated[str, Path(min_length=1, max_length=40, pattern=r"^[a-z0-9-]+$")]
_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut}, 409: {"model": ErrorOut}, 422: {"model": ErrorOut},
    502: {"model": ErrorOut}, 503: {"model": ErrorOut},
}


@router.post("/tunnels", dependencies=_TUNNELS_WRITE, status_code=201, responses=_ERRORS)
def create_tunnel(body: svc.TunnelIn, session: SessionDep, cache: CacheDep, vici: ViciDep,
                  settings: SettingsDep) -> dict[str, Any]:
    """Negotiate, load both charons (fresh PSK, never returned), bring up, verify with list-sas.

    409: nothing feasible (nothing loaded). 503: a charon is unreachable. 502: strongSwan
    refused or negotiated something else. On any failure nothing stays loaded.
    """
    record = svc.create_tunnel(session=session, cache=cache, vici=vici, request=body,
                               default_table=settings.default_table)
    out = record.as_dict()
    out["ike"] = record.negotiation.get("ike")
    out["notes"] = record.negotiation.get("notes")
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
