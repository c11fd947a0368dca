"""A user's devices in the console: each target's device enrolments of that user with their state
(active, stale with the reason, revoked, expired), and revoking one, through the Host role's own
calls, as ``/v1/agent/users/{user_id}/devices`` makes them (``agent:enroll``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Path, Request
from starlette.responses import Response

from app.domain.agent.platforms import LABELS
from app.domain.errors import GatewayError, NotFound
from app.services.agent.host import HostAgent
from app.ui.pages.common import AgentWriter, console_router, failed, host_here, needs
from app.ui.render import page
from app.ui.session import Console, ConsoleDep
from app.web.deps import UserIdPath

__all__ = ["router"]

router = console_router()
UserId = UserIdPath
Ticket = Annotated[str, Path(min_length=32, max_length=32, pattern=r"^[0-9a-f]{32}$")]


def _host(request: Request) -> HostAgent:
    return host_here(request, nothing="it has no users or devices")


def _moments(device: dict[str, Any]) -> dict[str, Any]:
    """A listed device with its times as datetimes (the ``when`` filter shows them)."""
    return {**device, **{k: datetime.fromtimestamp(device[k], UTC) if device[k] is not None else None
                         for k in ("created", "expires", "ended")}}


def _page(request: Request, who: Console, user_id: str, *, notice: str | None = None, error: str | None = None,
          status: int = 200) -> Response:
    listed = _host(request).user_devices(user_id)
    return page("agent_devices.html", {
        "console": who, "section": "agent", "user_id": user_id, "devices": [_moments(d) for d in listed["devices"]],
        "unanswered": listed["unanswered"], "labels": LABELS, "notice": notice, "error": error}, status=status)


@router.get("/agent/users/{user_id}/devices")
def devices(user_id: UserId, request: Request, who: ConsoleDep) -> Response:
    """A user's devices at every target, each with its state and why it ended."""
    needs(who, "agent:enroll")
    return _page(request, who, user_id)


@router.get("/agent/users/{user_id}/devices/{ticket}/revoke")
def confirm_revoke(user_id: UserId, ticket: Ticket, who: ConsoleDep) -> Response:
    """Ask before revoking a device."""
    needs(who, "agent:enroll")
    return page("confirm.html", {
        "console": who, "section": "agent", "title": f"Revoke this device of {user_id}?",
        "message": f"The device {ticket[:12]}… loses its tunnel now, and its certificate is refused from then "
                   f"on: to use it again, {user_id} enrols it again.",
        "action": f"/ui/agent/users/{user_id}/devices/{ticket}/revoke", "fields": {},
        "button": "Revoke the device", "cancel": f"/ui/agent/users/{user_id}/devices"})


@router.post("/agent/users/{user_id}/devices/{ticket}/revoke")
def revoke(user_id: UserId, ticket: Ticket, request: Request, who: AgentWriter) -> Response:
    """Revoke one of a user's devices; the page says which target ended it."""
    host = _host(request)
    request.state.audit_detail = f"revoke device user={user_id} ticket={ticket}"
    try:
        outcome = host.revoke_device(user_id=user_id, ticket=ticket)
    except (NotFound, GatewayError) as exc:
        status = 404 if isinstance(exc, NotFound) else 503
        failed(request, type(exc).__name__, status)
        return _page(request, who, user_id, error=f"Not revoked: {exc.message}", status=status)
    return _page(request, who, user_id, notice=f"The device {ticket[:12]}… of {user_id} is revoked at "
                                               f"{outcome['target']}: its tunnel is down and its certificate "
                                               "refused.")
