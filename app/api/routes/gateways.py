"""Gateways: the strongSwan instances qoss drives.

A registration or a refresh reads charon in a dependency that runs before the unit of work's
(:data:`ProbedGateway`, :data:`ReadAgainGateway`): a charon that is slow, or a socket that never
answers, holds a worker thread for at most ``gateway_probe_timeout`` and never a write slot or a
write transaction; the unit of work then only stores what was read.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from app.domain.tunnels import Gateway
from app.services import gateways as svc
from app.web.deps import NamePath, ProberDep, ReadUnitDep, SettingsDep, UnitDep, require
from app.web.edits import EditDep
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import GatewayIn, error_responses

__all__ = ["router"]

router = APIRouter(tags=["gateways"], route_class=QossRoute)
_GATEWAYS_WRITE = [Depends(require("gateways:write"))]
_TUNNELS_READ = [Depends(require("tunnels:read"))]

GatewayName = NamePath
_ERRORS = error_responses(404, 409, 422, 503)


def probed_gateway(body: GatewayIn, settings: SettingsDep, vici: ProberDep) -> Gateway:
    """The gateway a registration names, read from its charon (a plain function: FastAPI runs it
    in a worker thread, before the route's unit of work takes a write slot)."""
    return svc.probe_gateway(vici=vici, body=body.to_domain(),
                             allowed_socket_dirs=settings.vici_socket_dirs,
                             allowed_networks=settings.gateway_networks)


def read_gateway_again(name: GatewayName, request: Request, settings: SettingsDep, vici: ProberDep) -> Gateway:
    """A registered gateway read from its charon again (as :func:`probed_gateway`: before the
    route's unit of work; the record is read in a read-only unit of work of its own, ended first)."""
    units = runtime(request).read_units
    with units() as uow:
        gateway = svc.get_gateway(uow=uow, name=name)
    return svc.read_gateway_again(vici=vici, gateway=gateway,
                                  allowed_socket_dirs=settings.vici_socket_dirs)


#: Declared before ``UnitDep`` in a route's parameters: FastAPI solves dependencies in order.
ProbedGateway = Annotated[Gateway, Depends(probed_gateway)]
ReadAgainGateway = Annotated[Gateway, Depends(read_gateway_again)]


@router.get("/gateways", dependencies=_TUNNELS_READ)
def list_gateways(uow: ReadUnitDep) -> list[dict[str, Any]]:
    """Every registered gateway with its back end and algorithms."""
    return [g.as_dict() for g in svc.list_gateways(uow=uow)]


@router.post("/gateways", dependencies=_GATEWAYS_WRITE, status_code=201, responses=_ERRORS)
def register_gateway(gateway: ProbedGateway, uow: UnitDep) -> dict[str, Any]:
    """Register a charon; its back end and algorithms are read over VICI (503 ``GatewayUnreachable``
    if no charon answers on the socket, whatever the reason)."""
    return svc.add_gateway(uow=uow, gateway=gateway).as_dict()


@router.get("/gateways/{name}", dependencies=_TUNNELS_READ, responses=_ERRORS)
def get_gateway(name: GatewayName, uow: ReadUnitDep) -> dict[str, Any]:
    """One gateway."""
    return svc.get_gateway(uow=uow, name=name).as_dict()


@router.post("/gateways/{name}/refresh", dependencies=_GATEWAYS_WRITE, responses=_ERRORS)
def refresh_gateway(gateway: ReadAgainGateway, uow: UnitDep, edit: EditDep) -> Any:
    """Read the gateway's back end and algorithms again; the tunnels on it are negotiated again
    (and moved) afterwards. ``?dry_run=true``: nothing is kept; the answer is what would be
    stored and its impact on the running tunnels."""
    return edit.finish(uow, svc.refresh_gateway(uow=uow, gateway=gateway).as_dict())


@router.delete("/gateways/{name}", dependencies=_GATEWAYS_WRITE, status_code=204, responses=_ERRORS)
def delete_gateway(name: GatewayName, uow: UnitDep) -> Response:
    """Forget a gateway (409 while tunnels use it)."""
    svc.delete_gateway(uow=uow, name=name)
    return Response(status_code=204)
