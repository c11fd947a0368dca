"""Peers: the other qoss services this one negotiates tunnels with (``QOSS_PEER_NAME`` set).

Any session reads the list (``GET /v1/peers``): each peer's state, URL, the gateways and networks
of ours it may ask for, the minimum levels we demand of its tunnels, and the tunnels it carries.
With ``peers:write`` the page also shows this side's identity (``GET /v1/peering/identity``: what
the other side's administrator registers), registers a peer (``POST /v1/peers``, the same fields,
checked by the same document and service), and suspends, resumes or revokes one
(``PATCH /v1/peers/{name}``; suspending and revoking are asked first). Every change goes through
:class:`app.services.peering.Peering`, as the API's do, and is audited as they are.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Query, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from app.domain.errors import AlreadyExists, InvalidInput, NotFound, QossError
from app.domain.peering import PeerState
from app.domain.ports import UnitOfWork
from app.services import gateways as gateway_svc
from app.services.peering import Peering
from app.ui.pages.common import Name, console_router, failed, needs
from app.ui.render import page
from app.ui.session import Console, ConsoleDep, FormDep, writer
from app.web.deps import ReadUnitDep, UnitDep
from app.web.errors import status_for
from app.web.peering import PeerIn, peer_out
from app.web.runtime import runtime
from app.web.schemas import MinLevelsIn

__all__ = ["PEER_EVENTS", "router"]

router = console_router()
PeersWriter = Annotated[Console, Depends(writer("peers:write"))]
#: The events after which the list is read again: a peer registered or its state changed, a
#: tunnel made or taken down (the counts of the tunnels each carries).
PEER_EVENTS = ("peer.registered", "peer.state", "tunnel.created", "tunnel.deleted")
#: The public keys a peer's identity gives, as ``POST /v1/peers`` takes them.
KEY_FIELDS = tuple(f for f in PeerIn.model_fields if f.endswith("_public_key"))
#: Those of them an identity may lack (a peer registered without one is registered without it).
OPTIONAL_KEYS = tuple(f for f in KEY_FIELDS if not PeerIn.model_fields[f].is_required())
_KEY_LABELS = {"sign_public_key": "Signing public key", "kem_public_key": "Sealing public key",
               "mlkem_public_key": "Post-quantum sealing public key, ML-KEM-768"}
#: The registration form's text fields, as ``POST /v1/peers`` takes them.
FIELDS = ("name", "url", *KEY_FIELDS, "networks")
#: The minimum levels the form offers, as ``min_levels`` takes them.
LEVELS = tuple(MinLevelsIn.model_fields)
#: The most tunnels of a peer the list links to (the count is of all).
SHOWN_TUNNELS = 5
Shown = Annotated[str | None, Query(max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
#: What each change does: the state it sets and how the page says it was done.
_ACTIONS: dict[str, tuple[PeerState, str]] = {
    "suspend": (PeerState.SUSPENDED, "suspended"),
    "resume": (PeerState.ACTIVE, "resumed"),
    "revoke": (PeerState.REVOKED, "revoked"),
}
Action = Annotated[Literal["suspend", "resume", "revoke"], Path()]


def _peering(request: Request) -> Peering | None:
    return runtime(request).peering




def _empty_form() -> dict[str, Any]:
    return {**{f: "" for f in FIELDS}, "gateways": [], "levels": {k: "" for k in LEVELS}}


def _context(request: Request, who: Console, uow: UnitOfWork, **extra: Any) -> dict[str, Any]:
    peering = _peering(request)
    can_write = who.may("peers:write")
    context: dict[str, Any] = {
        "console": who, "enabled": peering is not None, "can_write": can_write, "peers": [],
        "identity": None, "identity_text": "", "our_gateways": [], "form": _empty_form(), "errors": {},
        "notice": None, "levels": LEVELS, "key_fields": KEY_FIELDS, "key_labels": _KEY_LABELS,
        "optional_keys": OPTIONAL_KEYS,
        "shown_tunnels": SHOWN_TUNNELS, "events": " ".join(PEER_EVENTS),
        "may_see_tunnels": who.may("tunnels:read")}
    if peering is None:
        return {**context, **extra}
    if can_write:  # first: made on first use, in a transaction of its own, before this one reads
        identity = peering.identity()
        context["identity"] = identity
        context["identity_text"] = json.dumps(identity, indent=2)
        context["our_gateways"] = [g.name for g in gateway_svc.list_gateways(uow=uow)]
    unheard, carried = uow.peers.unheard_counts(), uow.tunnels.ids_by_peer()
    context["peers"] = [{**peer_out(p, unheard), "tunnels": carried.get(p.name, [])} for p in uow.peers.list()]
    return {**context, **extra}


@router.get("/peers")
def peers(request: Request, who: ConsoleDep, uow: ReadUnitDep, registered: Shown = None,
          changed: Shown = None, action: Annotated[str | None, Query(pattern=r"^[a-z]{1,10}$")] = None) -> Response:
    """Every registered peer (``GET /v1/peers``) with the tunnels it carries; to a token with
    ``peers:write`` this side's identity, the registration form and each peer's state changes."""
    notice = (f"Peer {registered} is registered: it can ask for tunnels once it has registered this side too."
              if registered else
              f"Peer {changed} is {_ACTIONS[action][1]}." if changed and action in _ACTIONS else None)
    return page("peers.html", _context(request, who, uow, notice=notice))


def _levels(form: dict[str, str]) -> dict[str, Any] | None:
    """The form's minimum levels as ``min_levels`` (an empty field is left out; the API's document
    judges the rest, so "eight" is refused there, as it would be in JSON)."""
    levels: dict[str, Any] = {}
    for level in LEVELS:
        raw = form.get(f"level:{level}", "").strip()
        if raw:
            levels[level] = int(raw) if re.fullmatch(r"-?[0-9]{1,3}", raw) else raw
    return levels or None


def _document(form: dict[str, str]) -> dict[str, Any]:
    """The form as ``POST /v1/peers``'s body: the gateways ticked, the networks one to a line (or
    separated by commas or spaces)."""
    document: dict[str, Any] = {f: form.get(f, "").strip() for f in FIELDS if f != "networks"}
    for key in OPTIONAL_KEYS:  # an optional key left empty is no key, as a JSON body without it
        if not document[key]:
            del document[key]
    document["gateways"] = sorted(k.split(":", 1)[1] for k, v in form.items() if k.startswith("gateway:") and v)
    document["networks"] = [n for n in re.split(r"[\s,]+", form.get("networks", "")) if n]
    levels = _levels(form)
    if levels is not None:
        document["min_levels"] = levels
    return document


def _field_errors(exc: ValidationError) -> dict[str, str]:
    """Each refused field's messages, keyed by the form's field (a level by ``level:NAME``)."""
    errors: dict[str, list[str]] = {}
    for e in exc.errors():
        loc = [str(p) for p in e["loc"]]
        field = loc[0] if loc else "form"
        if field == "min_levels" and len(loc) > 1:
            field = f"level:{loc[1]}"
        message = str(e["msg"]).removeprefix("Value error, ")
        errors.setdefault(field, []).append(message)
    return {k: "; ".join(v) for k, v in errors.items()}


def _error_field(exc: QossError) -> str:
    """The form's field a refusal from the document or the service is about."""
    if isinstance(exc, AlreadyExists):
        return "name"
    if isinstance(exc, NotFound):
        return "gateways"
    return next((f for f in KEY_FIELDS if f in exc.message), "keys")


@router.post("/peers")
def register(request: Request, who: PeersWriter, form: FormDep, uow: UnitDep) -> Response:
    """Register a peer (``POST /v1/peers``): checked by the API's own document and registered by
    the same service. A refused field is shown beside it, the form kept; nothing is registered."""
    peering = _peering(request)
    if peering is None:
        raise NotFound("this service has no peers: set QOSS_PEER_NAME to take part in peering")
    document = _document(form)
    shown = {**{f: form.get(f, "") for f in FIELDS}, "gateways": document["gateways"],
             "levels": {k: form.get(f"level:{k}", "") for k in LEVELS}}
    try:
        body = PeerIn.model_validate(document)
        peer = peering.register(uow=uow, peer=body.to_peer())
    except ValidationError as exc:
        errors, status, error = _field_errors(exc), 422, "ValidationError"
    except (InvalidInput, NotFound, AlreadyExists) as exc:
        errors, status, error = {_error_field(exc): exc.message}, status_for(exc), type(exc).__name__
    else:
        request.state.audit_detail = f"peer {peer.name} registered ({peer.url})"
        return RedirectResponse(f"/ui/peers?registered={peer.name}", status_code=303)
    uow.rollback()
    failed(request, error, status)
    return page("peers.html", _context(request, who, uow, form=shown, errors=errors), status=status)


def _confirm_text(name: str, action: str, url: str, tunnels: int) -> tuple[str, str]:
    carried = f"{tunnels} tunnel{'' if tunnels == 1 else 's'}"
    if action == "revoke":
        return (f"Revoke the peering with {name}?",
                f"Revoking ends the {carried} it carries, on both sides: each is taken down on our charon and "
                f"{name} ({url}) is told to take down its end. {name} can ask for nothing more. This cannot be "
                "undone: to peer again, register it anew under another name.")
    if action == "suspend":
        return (f"Suspend the peering with {name}?",
                f"Neither side can start a new tunnel with {name} until it is resumed. The {carried} it carries "
                "stay up.")
    return (f"Resume the peering with {name}?", f"{name} can ask for tunnels again, and we can ask it.")


@router.get("/peers/{name}/{action}")
def confirm(name: Name, action: Action, request: Request, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """Ask before changing a peering's state (revoking says how many tunnels end)."""
    needs(who, "peers:write")
    if _peering(request) is None:
        raise NotFound("this service has no peers: set QOSS_PEER_NAME to take part in peering")
    peer = uow.peers.get(name)
    title, message = _confirm_text(name, action, peer.url, len(uow.tunnels.with_peer(name)))
    return page("confirm.html", {
        "console": who, "section": "peers", "title": title, "message": message,
        "action": f"/ui/peers/{name}/{action}", "fields": {},
        "button": f"{action.capitalize()} {name}", "cancel": f"/ui/peers#peer-{name}"})


@router.post("/peers/{name}/{action}")
def change(name: Name, action: Action, request: Request, who: PeersWriter, uow: UnitDep) -> Response:
    """Suspend, resume or revoke a peering (``PATCH /v1/peers/{name}``): revoking ends every tunnel
    it carries, on both sides; a revoked peering cannot be resumed (409, said on the page)."""
    peering = _peering(request)
    if peering is None:
        raise NotFound("this service has no peers: set QOSS_PEER_NAME to take part in peering")
    state, done = _ACTIONS[action]
    peer = peering.set_state(uow=uow, name=name, state=state)
    request.state.audit_detail = f"peer {peer.name} {done}"
    return RedirectResponse(f"/ui/peers?changed={peer.name}&action={action}", status_code=303)
