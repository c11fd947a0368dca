"""Gateways: the strongSwan instances qoss drives."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response

from app.services import gateways as svc
from app.services.inputs import GatewayIn
from app.web.deps import ReadUnitDep, SettingsDep, UnitDep, ViciDep, require
from app.web.edits import EditDep
from app.web.routing import QossRoute
from app.web.schemas import ErrorOut

__all__ = ["router"]

router = APIRouter(tags=["gateways"], route_class=QossRoute)
_GATEWAYS_WRITE = [Depends(require("gateways:write"))]
_TUNNELS_READ = [Depends(require("tunnels:read"))]

GatewayName = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut}, 409: {"model": ErrorOut}, 422: {"model": ErrorOut}, 503: {"model": ErrorOut},
}


@router.get("/gateways", dependencies=_TUNNELS_READ)
def list_gateways(uow: ReadUnitDep) -> list[dict[str, Any]]:
    """Every registered gateway with its back end and algorithms."""
    return [g.as_dict() for g in svc.list_gateways(uow=uow)]


@router.post("/gateways", dependencies=_GATEWAYS_WRITE, status_code=201, responses=_ERRORS)
def register_gateway(body: GatewayIn, uow: UnitDep, vici: ViciDep, settings: SettingsDep) -> dict[str, Any]:
    """Register a charon; its back end and algorithms are read over VICI (503 if it does not answer)."""
    gateway = svc.register_gateway(uow=uow, vici=vici, body=body,
                                   allowed_socket_dirs=settings.vici_socket_dirs,
                                   allowed_networks=settings.gateway_networks)
    return gateway.as_dict()


@router.get("/gateways/{name}", dependencies=_TUNNELS_READ, responses=_ERRORS)
def get_gateway(name: GatewayName, uow: ReadUnitDep) -> dict[str, Any]:
    """One gateway."""
    return svc.get_gateway(uow=uow, name=name).as_dict()


@router.post("/gateways/{name}/refresh", dependencies=_GATEWAYS_WRITE, responses=_ERRORS)
def refresh_gateway(name: GatewayName, uow: UnitDep, vici: ViciDep, edit: EditDep) -> Any:
    """Read the gateway's back end and algorithms again; the tunnels on it are negotiated again
    (and moved) afterwards. ``?dry_run=true``: nothing is kept; the answer is what would be
    stored and its impact on the running tunnels."""
    return edit.finish(uow, svc.refresh_gateway(uow=uow, vici=vici, name=name).as_dict())


@router.delete("/gateways/{name}", dependencies=_GATEWAYS_WRITE, status_code=204, responses=_ERRORS)
def delete_gateway(name: GatewayName, uow: UnitDep) -> Response:
    """Forget a gateway (409 while tunnels use it)."""
    svc.delete_gateway(uow=uow, name=name)
    return Response(status_code=204)
