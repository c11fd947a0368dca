"""Administration: API tokens and the audit log."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from app.adapters.db import audit_log
from app.services import auth as svc
from app.web.deps import MAX_DB_INT, ActorDep, ReadUnitDep, UnitDep, require
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import TokenIn, error_responses

__all__ = ["router"]

router = APIRouter(tags=["admin"], route_class=QossRoute)
_ADMIN = [Depends(require("admin"))]
_AUDIT = [Depends(require("audit:read"))]
_ERRORS = error_responses(401, 403, 404, 422)


@router.post("/tokens", dependencies=_ADMIN, status_code=201, responses=_ERRORS)
def create_token(body: TokenIn, uow: UnitDep, actor: ActorDep, request: Request) -> dict[str, Any]:
    """A new token. ``token`` is shown in this answer only; qoss keeps its hash."""
    token, record = svc.create_token(uow=uow, name=body.name, scopes=body.scopes,
                                     expires_in=body.expires_in, created_by=actor, audit=False)
    request.state.audit_detail = svc.creation_detail(record)
    return svc.made_token(token, record)


@router.get("/tokens", dependencies=_ADMIN, responses=_ERRORS)
def list_tokens(uow: ReadUnitDep) -> list[dict[str, Any]]:
    """Every token, without secrets."""
    return svc.list_tokens(uow=uow)


@router.delete("/tokens/{token_id}", dependencies=_ADMIN, status_code=204, responses=_ERRORS)
def revoke_token(token_id: Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")], uow: UnitDep) -> Response:
    """Revoke a token at once."""
    svc.revoke_token(uow=uow, token_id=token_id, audit=False)
    return Response(status_code=204)


_NDJSON = "application/x-ndjson"
_AUDIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_ERRORS, 200: {"content": {_NDJSON: {"schema": {"type": "string"}}},
                     "description": "JSON records, or with format=jsonl (or Accept: application/x-ndjson) "
                                    "one JSON line per record, oldest first, with prev_hash and hash"}}


@router.get("/audit", dependencies=_AUDIT, responses=_AUDIT_RESPONSES, response_model=list[dict[str, Any]])
def list_audit(
    request: Request,
    uow: ReadUnitDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=MAX_DB_INT, description="records older than this id")] = None,
    since: Annotated[int | None, Query(ge=0, le=MAX_DB_INT, description="records newer than this id")] = None,
    outcome: Annotated[int | None, Query(ge=100, le=599, description="only this HTTP status")] = None,
    action: Annotated[str | None, Query(pattern=r"^[A-Z]{1,16}$", description="only this method")] = None,
    format: Annotated[Literal["json", "jsonl"] | None, Query(
        description="jsonl: the hash chain export for a SIEM, oldest first (not filtered)")] = None,
) -> Any:
    """Audit records, newest first (pending records are written first), filtered by ``outcome`` and
    ``action``. As JSON lines (``format=jsonl`` or ``Accept: application/x-ndjson``): the whole chain,
    oldest first, each with its ``prev_hash`` and ``hash``; page on with ``since`` = the last id received."""
    runtime(request).auditor.flush()
    if format == "jsonl" or (format is None and _NDJSON in request.headers.get("accept", "")):
        lines = audit_log.export_lines(session=uow.session, since=since, before=before, limit=limit)
        return Response("".join(line + "\n" for line in lines), media_type=_NDJSON)
    return svc.list_audit(uow=uow, limit=limit, before_id=before, after_id=since, outcome=outcome, action=action)
