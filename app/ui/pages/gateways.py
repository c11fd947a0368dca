"""Gateways: the registered charons (``tunnels:read``), kept current from the event stream; with
``gateways:write`` a gateway is registered, checked (read again from its charon) and removed
(after a confirmation), as ``POST /v1/gateways``, ``POST /v1/gateways/{name}/refresh`` and
``DELETE /v1/gateways/{name}`` do it.

As the API does, a registration or a check reads charon first, in a worker thread of its own,
before the request takes a write place and a transaction (:func:`app.web.deps.in_unit`): a slow
charon never holds a write transaction, and the read is the API's probe (``ProberDep``), bounded
as a whole by ``gateway_probe_timeout``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from app.domain.charon_port import ViciFactory
from app.domain.errors import AlreadyExists, Conflict, GatewayUnreachable, InvalidInput, QossError
from app.domain.ports import UnitOfWork
from app.domain.tunnels import Gateway
from app.services import gateways as svc
from app.settings import Settings
from app.ui.pages.common import Name, console_router, failed, needs, problems
from app.ui.render import page
from app.ui.session import Console, ConsoleDep, FormDep, writer
from app.web.deps import ProberDep, ReadUnitDep, SettingsDep, UnitDep, in_unit, in_worker_thread
from app.web.errors import status_for
from app.web.runtime import runtime
from app.web.schemas import GatewayIn

__all__ = ["GATEWAY_EVENTS", "router"]

router = console_router()
GatewaysWriter = Annotated[Console, Depends(writer("gateways:write"))]
#: The events after which the list is read again (a charon read again, registered or removed).
GATEWAY_EVENTS = ("gateway.refreshed", "gateway.registered", "gateway.deleted")
#: The registration form's fields, as ``POST /v1/gateways`` takes them.
FIELDS = ("name", "vici_socket", "ike_address", "identity", "inside_networks")
Shown = Annotated[str | None, Query(max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


def _context(who: Console, uow: UnitOfWork, **extra: Any) -> dict[str, Any]:
    return {"console": who, "gateways": [g.as_dict() for g in svc.list_gateways(uow=uow)],
            "can_write": who.may("gateways:write"), "form": {f: "" for f in FIELDS}, "error": None,
            "notice": None, "checked": None, "events": " ".join(GATEWAY_EVENTS), **extra}


def _read_page(request: Request, who: Console, status: int, **extra: Any) -> Response:
    """The page, read in a read-only unit of work of its own (blocking: run in a worker thread)."""
    units = runtime(request).read_units
    with units() as uow:
        return page("gateways.html", _context(who, uow, **extra), status=status)


@router.get("/gateways")
def gateways(who: ConsoleDep, uow: ReadUnitDep, registered: Shown = None, removed: Shown = None) -> Response:
    """Every registered gateway with its back end and algorithms (``GET /v1/gateways``); to a
    token with ``gateways:write`` the forms that register, check and remove one."""
    needs(who, "tunnels:read")
    notice = (f"Gateway {registered} is registered." if registered else
              f"Gateway {removed} is removed." if removed else None)
    return page("gateways.html", _context(who, uow, notice=notice))


def _gateway_in(form: dict[str, str]) -> GatewayIn:
    """The form as ``POST /v1/gateways``'s body, validated by the API's own schema (inside
    networks one to a line, or separated by commas or spaces)."""
    document: dict[str, Any] = {f: form.get(f, "").strip() for f in FIELDS}
    document["identity"] = document["identity"] or None
    document["inside_networks"] = [n for n in re.split(r"[\s,]+", document["inside_networks"]) if n]
    try:
        return GatewayIn.model_validate(document)
    except ValidationError as exc:
        raise InvalidInput(problems(exc)) from exc


def _probe(vici: ViciFactory, settings: Settings, body: GatewayIn) -> Gateway:
    return svc.probe_gateway(vici=vici, body=body.to_domain(),
                             allowed_socket_dirs=settings.vici_socket_dirs,
                             allowed_networks=settings.gateway_networks)


@router.post("/gateways")
async def register(request: Request, who: GatewaysWriter, form: FormDep, settings: SettingsDep,
                   vici: ProberDep) -> Response:
    """Register a charon (``POST /v1/gateways``): read it over VICI, then store it. A bad field, no
    charon on the socket, or a name taken answers the form again with what is wrong; nothing is kept."""
    shown = {f: form.get(f, "") for f in FIELDS}
    try:
        body = _gateway_in(form)
        gateway = await in_worker_thread(_probe, vici, settings, body)
        await in_unit(request, lambda uow, _reads: svc.add_gateway(uow=uow, gateway=gateway))
    except (InvalidInput, GatewayUnreachable, AlreadyExists) as exc:
        status = status_for(exc)
        failed(request, type(exc).__name__, status)
        return await in_worker_thread(_read_page, request, who, status, form=shown,
                                      error=f"Not registered: {exc.message}")
    return RedirectResponse(f"/ui/gateways?registered={gateway.name}", status_code=303)


def _stored(request: Request, name: str) -> Gateway:
    units = runtime(request).read_units
    with units() as uow:
        return svc.get_gateway(uow=uow, name=name)


@router.post("/gateways/{name}/check")
async def check(name: Name, request: Request, who: GatewaysWriter, settings: SettingsDep,
                vici: ProberDep) -> Response:
    """Read the gateway's charon again and store what it says (``POST /v1/gateways/{name}/refresh``:
    the tunnels on it are negotiated again afterwards); the page shows the answer, and what changed."""
    before = await in_worker_thread(_stored, request, name)  # 404 page for an unknown gateway
    try:
        again = await in_worker_thread(svc.read_gateway_again, vici=vici, gateway=before,
                                       allowed_socket_dirs=settings.vici_socket_dirs)
        stored = await in_unit(request, lambda uow, _reads: svc.refresh_gateway(uow=uow, gateway=again))
    except QossError as exc:  # unreachable, or deleted meanwhile
        status = status_for(exc)
        failed(request, type(exc).__name__, status)
        return await in_worker_thread(_read_page, request, who, status,
                                      error=f"{name} not checked: {exc.message}")
    old, new = set(before.algorithms), set(stored.algorithms)
    checked = {"gateway": stored.as_dict(), "added": sorted(new - old), "removed": sorted(old - new),
               "was": {"backend": before.backend, "version": before.version}}
    return await in_worker_thread(_read_page, request, who, 200, checked=checked)


@router.get("/gateways/{name}/remove")
def confirm_remove(name: Name, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """Ask before removing a gateway."""
    needs(who, "gateways:write")
    gateway = svc.get_gateway(uow=uow, name=name)
    return page("confirm.html", {
        "console": who, "section": "gateways", "title": f"Remove gateway {name}?",
        "message": f"qoss forgets the charon at {gateway.vici_socket} ({gateway.ike_address}): no tunnel can be "
                   "made on it until it is registered again. charon itself is not touched. A gateway that "
                   "tunnels use cannot be removed: tear them down first.",
        "action": f"/ui/gateways/{name}/remove", "fields": {}, "button": f"Remove {name}",
        "cancel": "/ui/gateways"})


@router.post("/gateways/{name}/remove")
def remove(name: Name, request: Request, who: GatewaysWriter, uow: UnitDep) -> Response:
    """Forget a gateway (``DELETE /v1/gateways/{name}``); refused (409, said on the page) while tunnels use it."""
    try:
        svc.delete_gateway(uow=uow, name=name)
    except Conflict as exc:
        uow.rollback()
        failed(request, type(exc).__name__, 409)
        return page("gateways.html", _context(who, uow, error=f"{name} is not removed: {exc.message}"),
                    status=409)
    return RedirectResponse(f"/ui/gateways?removed={name}", status_code=303)
