"""The tunnel agent: enrolled users (list, enrol from a public key file, revoke) through the Host
role's own calls, as ``/v1/agent/users`` makes them (``agent:enroll``); the Target role's live
sessions, read-only (``tunnels:read``)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from pydantic import ValidationError
from starlette.responses import Response

from app.domain.agent import AgentSessionState
from app.domain.agent.platforms import PLATFORMS
from app.domain.errors import AlreadyExists, InvalidInput
from app.services.agent.host import HostAgent
from app.services.agent.invitations import INVITATION_PLATFORMS, invitation_link_id
from app.services.agent.target import TargetAgent
from app.ui.pages.common import AgentWriter, console_router, failed, needs, problems
from app.ui.render import page
from app.ui.session import INVALID_UPLOAD, Console, ConsoleDep, FormDep
from app.web.deps import UserIdPath
from app.web.runtime import runtime
from app.web.schemas import EnrollIn

__all__ = ["router"]

router = console_router()
UserId = UserIdPath
_SESSIONS = 100
#: The events after which the page's lists are read again: a user enrolled or revoked is an audit
#: entry (seen by a session with ``audit:read``); a session's tunnel comes and goes with its events.
AGENT_EVENTS = ("audit", "agent.session.closed", "tunnel.created", "tunnel.deleted", "tunnel.state")


def _host(request: Request) -> HostAgent | None:
    host = runtime(request).agent_host
    return host


def _target(request: Request) -> TargetAgent | None:
    target = runtime(request).agent_target
    return target


def _page(request: Request, who: Console, *, notice: str | None = None, error: str | None = None,
          status: int = 200, invited: dict[str, Any] | None = None) -> Response:
    host, target = _host(request), _target(request)
    users = host.users() if host is not None and who.may("agent:enroll") else None
    sessions = (target.sessions(state=AgentSessionState.ACTIVE, limit=_SESSIONS)
                if target is not None and who.may("tunnels:read") else None)
    return page("agent.html", {"console": who, "host": host is not None, "target": target is not None,
                               "users": users, "sessions": sessions, "notice": notice, "error": error,
                               "events": " ".join(AGENT_EVENTS), "invited": invited,
                               "invitation_platforms": [(p, PLATFORMS[p].label) for p in INVITATION_PLATFORMS]},
                status=status)


@router.get("/agent")
def agent(request: Request, who: ConsoleDep) -> Response:
    """Enrolled users (``agent:enroll``) and live sessions (``tunnels:read``) of the roles this server plays."""
    if not (who.may("agent:enroll") or who.may("tunnels:read")):
        needs(who, "agent:enroll")
    return _page(request, who)


def _enrolment(form: dict[str, str]) -> EnrollIn:
    """The uploaded ``<name>.pub.json`` (``qoss agent keygen``) and the ticked Objective-IDs, validated
    by the API's own schema."""
    if form.get("keyfile" + INVALID_UPLOAD):
        raise InvalidInput(f"the key file is {form['keyfile' + INVALID_UPLOAD]}: choose the user's <name>.pub.json")
    text = form.get("keyfile", "")
    if not text.strip():
        raise InvalidInput("choose the user's public key file (<name>.pub.json from `qoss agent keygen`)")
    try:
        keys = json.loads(text)
    except ValueError as exc:
        raise InvalidInput("the key file is not JSON: choose the user's <name>.pub.json") from exc
    if not isinstance(keys, dict):
        raise InvalidInput("the key file is not a qoss public key file")
    document: dict[str, Any] = {
        "user_id": form.get("user_id", "").strip() or keys.get("id"),
        "sign_public_key": keys.get("sign_public_key"), "kem_public_key": keys.get("kem_public_key"),
        "mlkem_public_key": keys.get("mlkem_public_key"),
        "objectives": [i for i in (1, 2, 3, 4) if form.get(f"objective{i}")]}
    if not document["objectives"]:
        raise InvalidInput("tick at least one Objective-ID the user may ask for")
    try:
        return EnrollIn.model_validate(document)
    except ValidationError as exc:
        raise InvalidInput(problems(exc)) from exc


@router.post("/agent/users")
def enroll(request: Request, who: AgentWriter, form: FormDep) -> Response:
    """Enrol a user: their public keys from the uploaded file, the Objective-IDs ticked."""
    host = _host(request)
    if host is None:
        return _page(request, who, error="This server does not play the agent's Host role.", status=404)
    try:
        body = _enrolment(form)
        user = host.enroll(user_id=body.user_id, sign_public_key=body.sign_public_key,
                           kem_public_key=body.kem_public_key, objectives=body.objectives,
                           mlkem_public_key=body.mlkem_public_key)
    except (InvalidInput, AlreadyExists) as exc:
        status = 409 if isinstance(exc, AlreadyExists) else 422
        failed(request, type(exc).__name__, status)
        return _page(request, who, error=f"Not enrolled: {exc.message}", status=status)
    request.state.audit_detail = f"enrolled {user['user_id']}"
    return _page(request, who, notice=f"{user['user_id']} is enrolled for Objective-IDs "
                                      f"{', '.join(str(o) for o in sorted(user.get('objectives', [])))}.",
                 status=201)


@router.get("/agent/users/{user_id}/revoke")
def confirm_revoke(user_id: UserId, who: ConsoleDep) -> Response:
    """Ask before revoking a user."""
    needs(who, "agent:enroll")
    return page("confirm.html", {
        "console": who, "section": "agent", "title": f"Revoke {user_id}?",
        "message": f"{user_id} can no longer ask for a tunnel, and every target is told to take their tunnels "
                   "down now. Enrolling them again needs new keys.",
        "action": f"/ui/agent/users/{user_id}/revoke", "fields": {}, "button": f"Revoke {user_id}",
        "cancel": "/ui/agent"})


@router.post("/agent/users/{user_id}/revoke")
def revoke(user_id: UserId, request: Request, who: AgentWriter) -> Response:
    """Revoke a user; every target is told to take the user's tunnels down (each target's outcome shown)."""
    host = _host(request)
    if host is None:
        return _page(request, who, error="This server does not play the agent's Host role.", status=404)
    outcome = host.revoke(user_id)
    request.state.audit_detail = f"revoked {user_id}"
    targets = "; ".join(f"{name}: {said}" for name, said in sorted(outcome["targets"].items())) or "no targets"
    return _page(request, who, notice=f"{user_id} is revoked ({targets}).")


@router.post("/agent/invitations")
def invite(request: Request, who: AgentWriter, form: FormDep) -> Response:
    """Invite a user's phone: the link is shown once, with a QR code for the phone's camera (Host
    keeps only its secret's SHA-256)."""
    import segno

    from app.services.agent.invitations import join_link

    host = _host(request)
    if host is None:
        return _page(request, who, error="This server does not play the agent's Host role.", status=404)
    try:
        secret, listed = host.invitations.invite(
            user_id=form.get("user_id", "").strip(), platform=form.get("platform", ""), created_by=who.name)
    except (InvalidInput, AlreadyExists) as exc:
        status = 409 if isinstance(exc, AlreadyExists) else 422
        failed(request, type(exc).__name__, status)
        return _page(request, who, error=f"Not invited: {exc.message}", status=status)
    link = join_link(str(request.base_url), secret)
    request.state.audit_detail = (f"invitation id={listed['id']} user={listed['user_id']} "
                                  f"platform={listed['platform']} link={invitation_link_id(secret)}")
    return _page(request, who, status=201, invited={
        **listed, "link": link, "qr": segno.make(link, error="m").svg_inline(scale=4, dark="#000", light="#fff")})
