"""The console's pages: thin views over the same services the REST API calls.

Each handler reads its input, calls one service through the request's unit of work, and
renders a template; a change answers htmx with a fragment and a plain browser with a
redirect (reading works without JavaScript).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import ValidationError
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from app.adapters import files
from app.api.deps import ActorDep, CacheDep, Principal, ReadUnitDep, SettingsDep, UnitDep
from app.api.errors import status_for
from app.api.schemas import RatingPatch
from app.domain.algorithms import lookup
from app.domain.auth import Forbidden, Unauthenticated
from app.domain.errors import InvalidInput, NoFeasibleSuite, NotFound, QossError, StaleRevision
from app.domain.ratings import Rating, RatingTable
from app.services import auth as auth_svc
from app.services import gateways as gateway_svc
from app.services import policies as policy_svc
from app.services import ratings as svc
from app.services import tunnels as tunnel_svc
from app.services import ui_sessions
from app.services.inputs import NegotiationIn
from app.services.negotiation import run_negotiation
from app.ui.render import page
from app.ui.routing import ConsoleRoute, is_htmx
from app.ui.session import (
    LOGIN_COOKIE,
    Console,
    ConsoleDep,
    FormDep,
    clear_session_cookie,
    login_check,
    new_login_nonce,
    set_login_cookie,
    set_session_cookie,
    writer,
)

__all__ = ["router"]

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

TableName = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
Keyword = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
RatingsWriter = Annotated[Console, Depends(writer("ratings:write"))]
PoliciesWriter = Annotated[Console, Depends(writer("policies:write"))]
AnyWriter = Annotated[Console, Depends(writer(None))]

#: The editable fields of a row, in the grid's order.
_LEVELS = ("confidentiality", "integrity", "key_exchange")
_FIELDS = (*_LEVELS, "performance", "reason")


# ------------------------------------------------------------------ sign-in


@router.get("")
def home() -> Response:
    return RedirectResponse("/ui/tables", status_code=303)


@router.get("/login")
def login_form(request: Request) -> Response:
    """The sign-in form (its CSRF value is also a short-lived cookie)."""
    nonce = new_login_nonce()
    response = page("login.html", {"console": None, "csrf": nonce, "error": None})
    set_login_cookie(response, request, nonce)
    return response


@router.post("/login")
def login(request: Request, form: FormDep, uow: UnitDep, settings: SettingsDep) -> Response:
    """Sign in with an API token: a server-side session, its id in an HttpOnly cookie."""
    login_check(request, form)
    try:
        session_id, record, token = ui_sessions.sign_in(
            uow=uow, presented=form.get("token", "").strip(), ttl=timedelta(seconds=settings.ui_session_ttl))
    except Unauthenticated:
        request.state.error_name = "Unauthenticated"
        request.state.route_status = 401
        nonce = new_login_nonce()
        response = page("login.html", {"console": None, "csrf": nonce,
                                       "error": "That token was not accepted (unknown, expired or revoked)."},
                        status=401)
        set_login_cookie(response, request, nonce)
        return response
    request.state.principal = Principal(token.id, token.name, token.scopes)
    request.state.audit_detail = "console sign-in"
    signed_in = RedirectResponse("/ui/tables", status_code=303)
    set_session_cookie(signed_in, request, session_id, record.expires_at)
    signed_in.delete_cookie(LOGIN_COOKIE, path="/ui/login")
    return signed_in


@router.post("/logout")
def logout(request: Request, who: AnyWriter, uow: UnitDep) -> Response:
    """End the session (CSRF-checked, so another site cannot sign an admin out)."""
    ui_sessions.sign_out(uow=uow, session_id=who.session_id)
    request.state.audit_detail = "console sign-out"
    response = RedirectResponse("/ui/login", status_code=303)
    clear_session_cookie(response, request)
    return response


# ------------------------------------------------------------------ rating tables


@router.get("/tables")
def tables(who: ConsoleDep, uow: ReadUnitDep) -> Response:
    return page("tables.html", {"console": who, "tables": svc.list_tables(uow=uow)})


def _row(rating: Rating) -> dict[str, Any]:
    """One grid row: the rating's own fields, its kind, its measured time per byte."""
    measured = rating.measurement.a_ns_per_byte if rating.measurement is not None else None
    blank = {"confidentiality": None, "integrity": None, "key_exchange": None, "reason": ""}
    return {**blank, **rating.as_dict(), "kind": lookup(rating.algorithm).kind, "ns_per_byte": measured}


def _grid(table: RatingTable) -> list[dict[str, Any]]:
    return [_row(r) for r in table.ratings.values()]


def _table_page(who: Console, table: RatingTable, *, editing: str | None = None,
                conflict: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                status: int = 200) -> Response:
    rows = _grid(table)
    if error is not None:  # the row being edited shows what the admin typed
        rows = [{**r, **error["mine"]} if r["algorithm"] == error["keyword"] else r for r in rows]
    return page("table.html", {"console": who, "table": table, "rows": rows, "editing": editing,
                               "conflict": conflict, "error": error}, status=status)


def _rating(table: RatingTable, keyword: str) -> Rating:
    rating = table.get(keyword)
    if rating is None:
        raise NotFound(f"{table.name} has no row {keyword!r}")
    return rating


@router.get("/tables/{name}")
def table(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    return _table_page(who, svc.get_table(uow=uow, name=name))


@router.get("/tables/{name}/ratings/{keyword}")
def row(name: TableName, keyword: Keyword, request: Request, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """One row as shown (htmx: cancel an edit, or drop one's own values after a conflict)."""
    current = svc.get_table(uow=uow, name=name)
    rating = _rating(current, keyword)
    if not is_htmx(request):
        return RedirectResponse(f"/ui/tables/{name}#row-{keyword}", status_code=303)
    return page("_row.html", {"console": who, "table": current, "r": _row(rating)})


@router.get("/tables/{name}/ratings/{keyword}/edit")
def edit_row(name: TableName, keyword: Keyword, request: Request, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The row as a form, based on the current revision (403 without ``ratings:write``)."""
    if not who.may("ratings:write"):
        raise Forbidden("ratings:write")
    current = svc.get_table(uow=uow, name=name)
    rating = _rating(current, keyword)
    if not is_htmx(request):
        return _table_page(who, current, editing=keyword)
    return page("_row_edit.html", {"console": who, "table": current, "r": _row(rating), "error": None})


def _patch(form: dict[str, str]) -> dict[str, Any]:
    """The form's fields as a rating patch, validated by the API's own schema (``RatingPatch``)."""
    document: dict[str, Any] = {}
    try:
        for field in _LEVELS:
            text = form.get(field, "").strip()
            document[field] = int(text) if text else None
        text = form.get("performance", "").strip()
        document["performance"] = float(text) if text else None
    except ValueError as exc:
        raise InvalidInput("levels are whole numbers 0-10 and performance a number 0-10") from exc
    document["reason"] = form.get("reason", "")
    try:
        return RatingPatch.model_validate(document).model_dump(exclude_unset=True)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise InvalidInput(problems) from exc


@router.post("/tables/{name}/ratings/{keyword}")
def save_row(name: TableName, keyword: Keyword, request: Request, who: RatingsWriter, form: FormDep,
             uow: UnitDep, actor: ActorDep, cache: CacheDep) -> Response:
    """Save one row with If-Match semantics: the form names the revision it was based on.

    A concurrent edit (``StaleRevision``) answers 409 with both values side by side: the
    admin re-applies theirs (based on the new revision) or drops it.
    """
    mine = {f: form.get(f, "") for f in _FIELDS}
    try:
        expected = int(form.get("revision", ""))
    except ValueError as exc:
        raise InvalidInput("the form names no revision") from exc
    try:
        changes = _patch(form)
        saved = svc.update_rating(uow=uow, name=name, algorithm=keyword, changes=changes,
                                  expected_revision=expected, author=actor)
    except StaleRevision:
        request.state.error_name = "StaleRevision"
        request.state.route_status = 409
        current = svc.get_table(uow=uow, name=name)
        conflict = {"keyword": keyword, "mine": mine, "theirs": _row(_rating(current, keyword)),
                    "revision": current.revision, "based_on": expected}
        if is_htmx(request):
            return page("_row_conflict.html", {"console": who, "table": current, "c": conflict}, status=409)
        return _table_page(who, current, conflict=conflict, status=409)
    except InvalidInput as exc:
        request.state.error_name = type(exc).__name__
        request.state.route_status = 422
        current = svc.get_table(uow=uow, name=name)
        error = {"keyword": keyword, "message": exc.message, "mine": mine}
        if is_htmx(request):
            return page("_row_edit.html", {"console": who, "table": current,
                                           "r": {**_row(_rating(current, keyword)), **mine},
                                           "error": exc.message}, status=422)
        return _table_page(who, current, editing=keyword, error=error, status=422)
    cache.invalidate(name)
    if is_htmx(request):
        return page("_row.html", {"console": who, "table": saved, "r": _row(_rating(saved, keyword)),
                                  "saved": True})
    return RedirectResponse(f"/ui/tables/{name}#row-{keyword}", status_code=303)


@router.get("/tables/{name}/revisions")
def revisions(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The history, newest first, each revision with its per-field changes."""
    return _history(who, name, svc.table_revisions(uow=uow, name=name), base=f"/ui/tables/{name}",
                    section="tables", can_revert=who.may("ratings:write"), by_algorithm=True)


def _history(who: Console, name: str, history: list[dict[str, Any]], *, base: str, section: str, can_revert: bool,
             by_algorithm: bool) -> Response:
    current = history[-1]["revision"] if history else 0
    return page("revisions.html", {"console": who, "name": name, "current": current, "base": base,
                                   "section": section, "can_revert": can_revert, "by_algorithm": by_algorithm,
                                   "revisions": list(reversed(history))})


@router.post("/tables/{name}/revert")
def revert(name: TableName, request: Request, who: RatingsWriter, form: FormDep, uow: UnitDep, actor: ActorDep,
           cache: CacheDep) -> Response:
    """Go back to a revision (a new revision; history kept). The form names the current
    revision it saw: a revert over someone's newer edit is refused (409)."""
    try:
        revision, expected = int(form.get("revision", "")), int(form.get("expected", ""))
    except ValueError as exc:
        raise InvalidInput("the form names no revision") from exc
    svc.revert_table(uow=uow, name=name, revision=revision, expected_revision=expected, author=actor)
    cache.invalidate(name)
    return RedirectResponse(f"/ui/tables/{name}/revisions", status_code=303)


@router.get("/tables/{name}/export")
def export(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The table as YAML, as ``GET /v1/rating-tables/{name}/export`` gives it."""
    text = files.dump_rating_table(svc.get_table(uow=uow, name=name), "yaml")
    return PlainTextResponse(text, media_type="application/yaml",
                             headers={"Content-Disposition": f'attachment; filename="{name}.yaml"'})


# ------------------------------------------------------------------ negotiation playground

_PEERS = 3


def _negotiation_document(query: dict[str, str]) -> dict[str, Any]:
    """The playground's query string as a negotiation request (``POST /v1/negotiations``'s body)."""
    peers = []
    for i in range(1, _PEERS + 1):
        name = query.get(f"p{i}", "").strip()
        if not name:
            continue
        peer: dict[str, Any] = {"name": name}
        levels = {}
        for short, level in (("c", "confidentiality"), ("i", "integrity"), ("k", "key_exchange")):
            text = query.get(f"p{i}{short}", "").strip()
            if text:
                try:
                    levels[level] = int(text)
                except ValueError as exc:
                    raise InvalidInput(f"peer {name}: {level} is a whole number 0-10") from exc
        if levels:
            peer["min_levels"] = levels
        if query.get(f"p{i}policy"):
            peer["policy"] = query[f"p{i}policy"]
        peers.append(peer)
    document: dict[str, Any] = {"peers": peers}
    if query.get("table"):
        document["rating_table"] = query["table"]
    size = query.get("packet_size", "").strip()
    if size:
        try:
            document["traffic"] = {"packet_size": int(size)}
        except ValueError as exc:
            raise InvalidInput("the packet size is a whole number of bytes") from exc
    return document


@router.get("/negotiate")
def negotiate(request: Request, who: ConsoleDep, uow: ReadUnitDep, cache: CacheDep, settings: SettingsDep,
              run: Annotated[bool, Query()] = False) -> Response:
    """The playground: peers and their minimums in, the chosen suite and why out (a GET: it
    changes nothing, and a result can be bookmarked)."""
    query = {k: v[:200] for k, v in request.query_params.items()}
    context: dict[str, Any] = {"console": who, "tables": svc.list_tables(uow=uow),
                               "policies": policy_svc.list_policies(uow=uow), "q": query, "peers": _PEERS,
                               "default_table": settings.default_table, "result": None, "problem": None}
    status = 200
    if run:
        problem: dict[str, Any] | None = None
        try:
            body = NegotiationIn.model_validate(_negotiation_document(query))
            result = run_negotiation(uow=uow, cache=cache, request=body, default_table=settings.default_table)
            context["result"] = result.as_dict()
        except ValidationError as exc:
            status, problem = 422, {"message": "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())}
        except NoFeasibleSuite as exc:
            status, problem = 409, exc.detail()
        except QossError as exc:
            status, problem = status_for(exc), {"message": exc.message}
        if problem is not None:
            context["problem"] = {"unmet": [], "notes": [], **problem}
    return page("negotiate.html", context, status=status)



# ------------------------------------------------------------------ policies, tunnels, gateways, audit


@router.get("/policies")
def policies(who: ConsoleDep, uow: ReadUnitDep) -> Response:
    return page("policies.html", {"console": who, "policies": policy_svc.list_policies(uow=uow)})


@router.get("/policies/{name}")
def policy(name: TableName) -> Response:
    return RedirectResponse(f"/ui/policies/{name}/revisions", status_code=303)


@router.get("/policies/{name}/revisions")
def policy_revisions(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """A policy's history, newest first, each revision with its per-field changes."""
    return _history(who, name, policy_svc.policy_revisions(uow=uow, name=name), base=f"/ui/policies/{name}",
                    section="policies", can_revert=who.may("policies:write"), by_algorithm=False)


@router.post("/policies/{name}/revert")
def revert_policy(name: TableName, who: PoliciesWriter, form: FormDep, uow: UnitDep, actor: ActorDep) -> Response:
    """Go back to a revision of a policy (a new revision; 409 if it changed since the page was loaded)."""
    try:
        revision, expected = int(form.get("revision", "")), int(form.get("expected", ""))
    except ValueError as exc:
        raise InvalidInput("the form names no revision") from exc
    policy_svc.revert_policy(uow=uow, name=name, revision=revision, expected_revision=expected, author=actor)
    return RedirectResponse(f"/ui/policies/{name}/revisions", status_code=303)


def _needs(who: Console, scope: str) -> None:
    if not who.may(scope):
        raise Forbidden(scope)


@router.get("/tunnels")
def tunnels(who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """Every tunnel qoss made, as its records say (``GET /v1/tunnels``), read-only."""
    _needs(who, "tunnels:read")
    return page("tunnels.html", {"console": who, "tunnels": [t.as_dict() for t in tunnel_svc.list_tunnels(uow=uow)]})


@router.get("/gateways")
def gateways(who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """Every registered gateway with its back end and algorithms (``GET /v1/gateways``), read-only."""
    _needs(who, "tunnels:read")
    return page("gateways.html", {"console": who,
                                  "gateways": [g.as_dict() for g in gateway_svc.list_gateways(uow=uow)]})


_AUDIT_PAGE = 100


@router.get("/audit")
def audit(request: Request, who: ConsoleDep, uow: ReadUnitDep,
          outcome: Annotated[int | None, Query(ge=100, le=599)] = None,
          action: Annotated[str | None, Query(pattern=r"^[A-Z]{0,16}$")] = None,
          before: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> Response:
    """The audit log, newest first, filtered by outcome and action (``GET /v1/audit``)."""
    _needs(who, "audit:read")
    request.app.state.auditor.flush()
    uow.rollback()  # the session check began a read: a fresh one sees what was just written
    records = auth_svc.list_audit(uow=uow, limit=_AUDIT_PAGE, before_id=before, outcome=outcome,
                                  action=action or None)
    more = records[-1]["id"] if len(records) == _AUDIT_PAGE else None
    return page("audit.html", {"console": who, "records": records, "outcome": outcome, "action": action or "",
                               "more": more})
