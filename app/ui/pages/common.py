"""What the console's page modules share: the router factory, path parameters, the writer
dependencies, scope checks, validation problems as text, the history page, and an edit's
impact on the running tunnels before it is saved."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import ValidationError
from starlette.responses import Response

from app.domain.auth import Forbidden
from app.domain.errors import InvalidInput, NotFound
from app.domain.ports import UnitOfWork
from app.services import impact
from app.services.agent.host import HostAgent
from app.settings import Settings
from app.ui.render import page
from app.ui.routing import ConsoleRoute
from app.ui.session import Console, writer
from app.web.deps import NamePath
from app.web.edits import sessions_of
from app.web.runtime import runtime

__all__ = [
    "AgentWriter",
    "AnyWriter",
    "Keyword",
    "Name",
    "PoliciesWriter",
    "RatingsWriter",
    "TunnelsWriter",
    "changed_by",
    "confirm_revert_page",
    "console_router",
    "failed",
    "form_revision",
    "history_page",
    "host_here",
    "impact_of",
    "needs",
    "problems",
]

Name = NamePath
Keyword = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
RatingsWriter = Annotated[Console, Depends(writer("ratings:write"))]
PoliciesWriter = Annotated[Console, Depends(writer("policies:write"))]
TunnelsWriter = Annotated[Console, Depends(writer("tunnels:write"))]
AgentWriter = Annotated[Console, Depends(writer("agent:enroll"))]
AnyWriter = Annotated[Console, Depends(writer(None))]


def console_router() -> APIRouter:
    """A router of console pages: under ``/ui``, errors as pages, not in the OpenAPI schema."""
    return APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)


def host_here(request: Request, *, nothing: str) -> HostAgent:
    """The agent's Host this server plays.

    Raises:
        NotFound: this server does not play Host; the message ends with ``nothing`` (what there
            is not here, in the page's words).
    """
    host = runtime(request).agent_host
    if host is None:
        raise NotFound(f"this server does not play the agent's Host role: {nothing}")
    return host


def needs(who: Console, scope: str) -> None:
    """403 unless the signed-in token has ``scope`` (reading pages it may not see)."""
    if not who.may(scope):
        raise Forbidden(scope)


def problems(exc: ValidationError) -> str:
    """A pydantic validation error as one line: ``field: message; ...``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


def form_revision(form: dict[str, str], field: str = "revision") -> int:
    """The revision a form names in ``field`` (the one its page was loaded at, or one to go back to).

    Raises:
        InvalidInput: the field is missing or not an integer.
    """
    try:
        return int(form.get(field, ""))
    except ValueError as exc:
        raise InvalidInput("the form names no revision") from exc


#: How many of the revisions saved since a form was opened :func:`changed_by` names (the newest).
_NAMED = 3


def _moment(text: str) -> str:
    """An ISO 8601 moment as people read it, to the second in UTC (a naive one is UTC)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def changed_by(history: list[dict[str, Any]], *, since: int, algorithm: str | None = None) -> str:
    """Who saved the revisions after revision ``since`` of a history (oldest first, as the
    services give it), and when, in words: "bob saved revision 3 at 2026-11-29 08:01:05 UTC".
    With ``algorithm``, the revisions that changed that row (all of them if none did by row,
    as when the whole table was replaced). The newest few are named, the others counted; empty
    if nothing was saved since."""
    later = [h for h in history if h["revision"] > since]
    if algorithm is not None:
        later = [h for h in later if any(c.get("algorithm") == algorithm for c in h.get("changes") or [])] or later
    named = [f"{h['author']} saved revision {h['revision']} at {_moment(str(h['created_at']))}"
             for h in later[-_NAMED:]]
    earlier = len(later) - len(named)
    return "; ".join(named) + (f" (and {earlier} earlier revision{'s' if earlier > 1 else ''})" if earlier else "")


def failed(request: Request, error: str, status: int) -> None:
    """Note on the request that a change was refused (for its audit record), as the route
    class does for a raised error, when the page answers the refusal itself."""
    request.state.error_name = error
    request.state.route_status = status


def history_page(who: Console, name: str, history: list[dict[str, Any]], *, base: str, section: str,
                 can_revert: bool, by_algorithm: bool) -> Response:
    """A table's or a policy's history, newest first, with a revert button per past revision; it
    follows the events of the table's (``section`` "tables") or the policy's revisions."""
    current = history[-1]["revision"] if history else 0
    kind = "rating_table" if section == "tables" else "policy"
    return page("revisions.html", {"console": who, "name": name, "current": current, "base": base,
                                   "events": f"{kind}.revision {kind}.deleted",
                                   "section": section, "can_revert": can_revert, "by_algorithm": by_algorithm,
                                   "revisions": list(reversed(history))})


def confirm_revert_page(request: Request, who: Console, uow: UnitOfWork, settings: Settings, *, section: str,
                        name: str, revision: int, current: int, changes: list[dict[str, Any]],
                        by_algorithm: bool) -> Response:
    """Ask before going back to ``revision`` of a table (``section`` "tables") or a policy: what it
    changes against the ``current`` revision, which the form names, and the impact of the revert
    made in ``uow`` (:func:`impact_of`: rolled back, nothing kept)."""
    base = f"/ui/{section}/{name}"
    return page("confirm.html", {
        "console": who, "section": section, "title": f"Revert {name} to revision {revision}?",
        "message": f"{name} becomes as it was in revision {revision}: a new revision {current + 1}, "
                   f"the history kept. Against revision {current}, the current one:",
        "changes": changes, "by_algorithm": by_algorithm,
        "action": f"{base}/revert", "fields": {"revision": revision, "expected": current},
        "button": f"Revert to revision {revision}", "cancel": f"{base}/revisions",
        "impact": impact_of(request, uow, settings)})


#: What the service does, once an edit is saved, with a tunnel still compliant but with another choice.
_AFTER_CHEAPER = {"never": "they stay as they are (QOSS_REKEY_CHEAPER=never)",
                  "on-next-rekey": "each moves at its next rekey (QOSS_REKEY_CHEAPER=on-next-rekey)",
                  "now": "moved once saved (QOSS_REKEY_CHEAPER=now)"}


#: Rows an impact preview shows per table (its counts are of all; ``?dry_run=true`` lists all).
IMPACT_ROWS = 100


def impact_of(request: Request, uow: UnitOfWork, settings: Settings) -> dict[str, Any]:
    """The impact on the running tunnels of the edit made in ``uow``, which is rolled back
    (:func:`app.services.impact.preview`: nothing of it kept), and what the service will do
    about each kind of tunnel once the edit is saved. The request's audit record says that
    nothing was saved."""
    report = impact.preview(uow, default_table=settings.default_table, sessions=sessions_of(request))
    request.state.audit_detail = "preview: nothing saved"
    shown = {"report": report, "sessions": report.sessions_by_kind(), "rows": IMPACT_ROWS}
    if not settings.rekey:
        off = "left as they are once saved (QOSS_REKEY is off)"
        return {**shown, "noncompliant": off, "changed": off, "sessions_noncompliant": off, "sessions_changed": off}
    return {**shown, "noncompliant": "moved to their new suite once saved (make-before-break)",
            "changed": _AFTER_CHEAPER[settings.rekey_cheaper],
            "sessions_noncompliant": "closed by the Target once saved, with the reason; the user connects again",
            "sessions_changed": "they keep their suite until the user next connects"}
