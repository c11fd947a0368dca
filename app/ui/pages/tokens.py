"""API tokens (``admin`` only): the list (never a secret), a new token whose secret is shown once
on the answer to its form, and revocation after a confirmation.

The same services as ``POST /v1/tokens`` and ``DELETE /v1/tokens/{id}``, audited as they are:
the request's record (the console user's name as who) with the API's detail, never the secret.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from starlette.responses import RedirectResponse, Response

from app.domain.auth import SCOPES, TOKEN_MAX_LIFETIME, TOKEN_NAME_MAX_LENGTH
from app.domain.errors import InvalidInput, NotFound
from app.domain.ports import UnitOfWork
from app.services import auth as svc
from app.ui.pages.common import console_router, failed, needs
from app.ui.render import page
from app.ui.session import Console, ConsoleDep, FormDep, writer
from app.web.deps import ActorDep, ReadUnitDep, UnitDep

__all__ = ["TOKEN_EVENTS", "router"]

router = console_router()
AdminWriter = Annotated[Console, Depends(writer("admin"))]
TokenId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]

#: The events after which the list is read again: every change through the API or the console is
#: an audit entry (an ``admin`` sees them all), whichever replica made it.
TOKEN_EVENTS = ("audit",)
#: The lifetime a new token is offered with, and the longest it may have, in days.
DEFAULT_DAYS = 90
MAX_DAYS = TOKEN_MAX_LIFETIME.days
#: The scopes offered as checkboxes, ``admin`` (all of them) last.
SCOPE_CHOICES = (*sorted(SCOPES - {"admin"}), "admin")


def _rows(uow: UnitOfWork) -> list[dict[str, Any]]:
    """Every token, newest first, with its state in words (no secret: the store has none)."""
    now = datetime.now(UTC)
    rows = []
    for t in reversed(svc.list_tokens(uow=uow)):
        expires = datetime.fromisoformat(t["expires_at"]) if t["expires_at"] else None
        state = "revoked" if t["revoked"] else "expired" if expires is not None and expires <= now else "active"
        rows.append({**t, "state": state})
    return rows


def _page(who: Console, uow: UnitOfWork, *, form: dict[str, Any] | None = None, error: str | None = None,
          notice: str | None = None, status: int = 200) -> Response:
    shown = form or {"name": "", "scopes": [], "days": str(DEFAULT_DAYS)}
    return page("tokens.html", {"console": who, "tokens": _rows(uow), "form": shown, "error": error,
                                "notice": notice, "scope_choices": SCOPE_CHOICES, "max_days": MAX_DAYS,
                                "name_max": TOKEN_NAME_MAX_LENGTH, "events": " ".join(TOKEN_EVENTS)},
                status=status)


@router.get("/tokens")
def tokens(who: ConsoleDep, uow: ReadUnitDep,
           revoked: Annotated[str | None, Query(pattern=r"^[0-9a-f]{12}$")] = None) -> Response:
    """Every token: name, scopes, created, expires, who made it, its state; the form for a new one."""
    needs(who, "admin")
    return _page(who, uow, notice=f"Token {revoked} is revoked." if revoked else None)


def _request(form: dict[str, str]) -> tuple[str, list[str], int]:
    """The form's name, ticked scopes and lifetime in seconds, each checked as the API checks them.

    Raises:
        InvalidInput: an empty or bad name, no scope or an unknown one, a lifetime that is not a
            whole number of days from 1 to :data:`MAX_DAYS`.
    """
    name = form.get("name", "").strip()
    if not name:
        raise InvalidInput("give the token a name: who or what it is for")
    scopes = [s for s in SCOPE_CHOICES if form.get(f"scope:{s}")]
    if not scopes:
        raise InvalidInput("tick at least one scope")
    days = form.get("days", "").strip()
    if not days.isdigit() or not 1 <= int(days) <= MAX_DAYS:
        raise InvalidInput(f"the lifetime is a whole number of days from 1 to {MAX_DAYS}")
    return name, scopes, int(days) * 86400


@router.post("/tokens")
def create(request: Request, who: AdminWriter, form: FormDep, uow: UnitDep, actor: ActorDep) -> Response:
    """Make a token (``POST /v1/tokens``): the answer shows its secret once; nothing keeps it."""
    shown = {"name": form.get("name", ""), "days": form.get("days", ""),
             "scopes": [s for s in SCOPE_CHOICES if form.get(f"scope:{s}")]}
    try:
        name, scopes, seconds = _request(form)
        secret, record = svc.create_token(uow=uow, name=name, scopes=scopes, expires_in=seconds,
                                          created_by=actor, audit=False)
    except InvalidInput as exc:
        uow.rollback()
        failed(request, type(exc).__name__, 422)
        return _page(who, uow, form=shown, error=f"No token made: {exc.message}.", status=422)
    request.state.audit_detail = svc.creation_detail(record)
    return page("token_created.html", {"console": who, "section": "tokens", "record": record,
                                       "scopes": sorted(record.scopes), "secret": secret}, status=201)


@router.get("/tokens/{token_id}/revoke")
def confirm_revoke(token_id: TokenId, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """Ask before revoking a token."""
    needs(who, "admin")
    found = next((t for t in svc.list_tokens(uow=uow) if t["id"] == token_id), None)
    if found is None:
        raise NotFound(f"token {token_id!r} does not exist")
    own = who.token is not None and who.token.id == token_id
    return page("confirm.html", {
        "console": who, "section": "tokens", "title": f"Revoke token {found['name']} ({token_id})?",
        "message": ("Every request with this token is refused from now on, and every console session it opened "
                    "ends. This cannot be undone: make a new token instead."
                    + (" This is the token you are signed in with: you will be signed out." if own else "")),
        "action": f"/ui/tokens/{token_id}/revoke", "fields": {}, "button": f"Revoke {found['name']}",
        "cancel": "/ui/tokens"})


@router.post("/tokens/{token_id}/revoke")
def revoke(token_id: TokenId, request: Request, who: AdminWriter, uow: UnitDep) -> Response:
    """Revoke a token at once (``DELETE /v1/tokens/{id}``); back to the list, which says so."""
    svc.revoke_token(uow=uow, token_id=token_id, audit=False)
    request.state.audit_detail = f"token {token_id} revoked"
    return RedirectResponse(f"/ui/tokens?revoked={token_id}", status_code=303)
