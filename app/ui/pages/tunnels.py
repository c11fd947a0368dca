"""Tunnels: the list (kept current from the event stream), a tunnel's detail with what its charon
says now, tear-down (``tunnels:write``, confirmed); and ``/ui/events``, the console session's own
view of ``GET /v1/events``. The gateways are in :mod:`app.ui.pages.gateways`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Header, Query, Request
from starlette.responses import RedirectResponse, Response

from app.domain.errors import NotFound
from app.domain.ports import UnitOfWork
from app.domain.sessions import hash_session_id
from app.services import tunnels as tunnel_svc
from app.services.events import StreamFollower
from app.ui.pages.common import TunnelsWriter, console_router, needs
from app.ui.render import page
from app.ui.routing import is_htmx
from app.ui.session import ConsoleDep
from app.web.deps import MAX_DB_INT, ReadUnitDep, TunnelIdPath, UnitDep, ViciDep
from app.web.runtime import runtime
from app.web.streams import follow

__all__ = ["TUNNEL_EVENTS", "router"]

router = console_router()
TunnelId = TunnelIdPath
#: The events after which the tunnel list is read again.
TUNNEL_EVENTS = ("tunnel.created", "tunnel.deleted", "tunnel.state", "tunnel.moved")


def _age(stamp: str | None, now: datetime) -> str:
    """How long ago an ISO time was, in words a person reads at a glance."""
    if not stamp:
        return ""
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return ""
    seconds = int((now - (then if then.tzinfo else then.replace(tzinfo=UTC))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{max(seconds, 0)} s"


#: Rows on one page of the console's tunnel list.
PAGE_ROWS = 100
Cursor = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$")]


def _listing(uow: UnitOfWork, cursor: str | None) -> dict[str, Any]:
    """One page of tunnels, with their ages, the cursor it starts at and the next page's."""
    now = datetime.now(UTC)
    found = tunnel_svc.page_tunnels(uow=uow, limit=PAGE_ROWS, cursor=cursor)
    rows = [{**d, "age": _age(d.get("created_at"), now)} for d in (t.as_dict() for t in found.records)]
    return {"tunnels": rows, "cursor": cursor, "next_cursor": found.next_cursor, "page_rows": PAGE_ROWS}


@router.get("/tunnels")
def tunnels(who: ConsoleDep, uow: ReadUnitDep, cursor: Cursor = None) -> Response:
    """The tunnels qoss made, as its records say (``GET /v1/tunnels``), a page of
    ``PAGE_ROWS`` at a time, oldest first; the page follows the events."""
    needs(who, "tunnels:read")
    return page("tunnels.html", {"console": who, **_listing(uow, cursor), "events": " ".join(TUNNEL_EVENTS)})


@router.get("/tunnels/rows")
def tunnel_rows(request: Request, who: ConsoleDep, uow: ReadUnitDep, cursor: Cursor = None) -> Response:
    """The page's rows alone (htmx reads them again after a tunnel event)."""
    needs(who, "tunnels:read")
    if not is_htmx(request):
        return RedirectResponse("/ui/tunnels", status_code=303)
    return page("_tunnel_rows.html", {"console": who, **_listing(uow, cursor)})


@router.get("/tunnels/{tunnel_id}")
def tunnel(tunnel_id: TunnelId, who: ConsoleDep, uow: ReadUnitDep, vici: ViciDep) -> Response:
    """One tunnel: its suite, state, ends, provenance, and what its charon says now
    (``GET /v1/tunnels/{id}``: bytes and packets where charon is reachable)."""
    needs(who, "tunnels:read")
    status = tunnel_svc.tunnel_status(uow=uow, vici=vici, tunnel_id=tunnel_id)
    now = datetime.now(UTC)
    return page("tunnel.html", {"console": who, "t": status, "age": _age(status.get("created_at"), now),
                                "updated": _age(status.get("updated_at"), now)})


@router.get("/tunnels/{tunnel_id}/teardown")
def confirm_teardown(tunnel_id: TunnelId, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """Ask before tearing a tunnel down."""
    needs(who, "tunnels:write")
    try:
        record = uow.tunnels.get(tunnel_id)
    except NotFound:
        return RedirectResponse("/ui/tunnels", status_code=303)
    far = record.responder or (record.peer.address if record.peer else "")
    told = (f" {record.peer.site}, the peer that owns the far end, is told to take down its end."
            if record.peer is not None and record.peer.site else "")
    return page("confirm.html", {
        "console": who, "section": "tunnels", "title": f"Tear down tunnel {tunnel_id}?",
        "message": f"The tunnel from {record.initiator} to {far} is terminated and its connection and secret "
                   f"unloaded from both ends; traffic between them stops.{told} This cannot be undone: a new "
                   "tunnel is a new request.",
        "action": f"/ui/tunnels/{tunnel_id}/teardown", "fields": {},
        "button": f"Tear down {tunnel_id}", "cancel": f"/ui/tunnels/{tunnel_id}"})


@router.post("/tunnels/{tunnel_id}/teardown")
def teardown(tunnel_id: TunnelId, request: Request, who: TunnelsWriter, uow: UnitDep, vici: ViciDep) -> Response:
    """Terminate and unload the tunnel on both ends (``DELETE /v1/tunnels/{id}``; a peered
    tunnel's peer is told to take down its end, as the API does)."""
    peering = runtime(request).peering
    if peering is not None:
        peering.delete_tunnel(uow=uow, reads=uow, tunnel_id=tunnel_id)
    else:
        tunnel_svc.delete_tunnel(uow=uow, vici=vici, tunnel_id=tunnel_id)
    request.state.audit_detail = f"tunnel {tunnel_id} torn down"
    return RedirectResponse("/ui/tunnels", status_code=303)


@router.get("/events")
async def events(request: Request, who: ConsoleDep,
                 last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=12,
                                                             pattern=r"^[0-9]+$")] = None,
                 after: Annotated[int | None, Query(ge=0, le=MAX_DB_INT)] = None) -> Response:
    """The events the signed-in token may see, as ``GET /v1/events`` streams them (same scopes,
    same resumption with ``Last-Event-ID``, same limits): the console's pages follow it with the
    session cookie, so no token is ever handed to a script. It ends within a second of the
    session's sign-out or expiry, or of its token's revocation or expiry."""
    start = after if after is not None else int(last_event_id) if last_event_id else None
    return await follow(request, StreamFollower(who.holder, hash_session_id(who.session_id)), start)
