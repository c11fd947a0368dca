"""The audit log, newest first, filtered by outcome and action (``GET /v1/audit``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from starlette.responses import Response

from app.services import auth as auth_svc
from app.ui.pages.common import console_router, needs
from app.ui.render import page
from app.ui.session import ConsoleDep
from app.web.deps import ReadUnitDep
from app.web.runtime import runtime

__all__ = ["router"]

router = console_router()
_AUDIT_PAGE = 100


@router.get("/audit")
def audit(request: Request, who: ConsoleDep, uow: ReadUnitDep,
          outcome: Annotated[int | None, Query(ge=100, le=599)] = None,
          action: Annotated[str | None, Query(pattern=r"^[A-Z]{0,16}$")] = None,
          before: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> Response:
    """The audit log, newest first, filtered by outcome and action (``GET /v1/audit``)."""
    needs(who, "audit:read")
    runtime(request).auditor.flush()
    uow.rollback()  # the session check began a read: a fresh one sees what was just written
    records = auth_svc.list_audit(uow=uow, limit=_AUDIT_PAGE, before_id=before, outcome=outcome,
                                  action=action or None)
    more = records[-1]["id"] if len(records) == _AUDIT_PAGE else None
    return page("audit.html", {"console": who, "records": records, "outcome": outcome, "action": action or "",
                               "more": more})
