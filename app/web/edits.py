"""What follows an edit of a rating table, a policy or a gateway: with ``?dry_run=true`` the
edit is made, its impact on the running tunnels and the agent sessions of this database assessed,
and all of it rolled back. Otherwise it commits with its event, which the leading replica's
rekeyer reads to negotiate the running tunnels again (:mod:`app.services.rekey`), whichever
replica took the edit, and every process playing Target on this database reads to close the
sessions left below their minimums (:mod:`app.services.agent.target_edits`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.responses import JSONResponse

from app.domain.agent.ports import AgentSession
from app.domain.ports import UnitOfWork
from app.services.agent.target_edits import active_sessions
from app.services.impact import preview
from app.web.runtime import runtime

__all__ = ["Edit", "EditDep", "count_revision", "sessions_of"]


def sessions_of(request: Request) -> list[AgentSession]:
    """The active agent sessions in this service's database (none without its agent store)."""
    return active_sessions(runtime(request).agent_reads)


def count_revision(request: Request, kind: str) -> None:
    """Count one new revision of a ``rating_table`` or a ``policy`` (``qoss_revisions_total``)."""
    runtime(request).metrics.count("qoss_revisions_total", kind=kind)


@dataclass
class Edit:
    """The edit's mode (``dry_run``) and what to do once it is made."""

    dry_run: bool
    request: Request

    def finish(self, uow: UnitOfWork, document: dict[str, Any], revised: str | None = None) -> Any:
        """The answer of an edit made in ``uow``: the document, or with ``dry_run`` the document
        it would have made and its impact on every running tunnel (``impact``) and active agent
        session (``sessions``), nothing kept. ``revised``: the kind of revision the edit made
        (``rating_table``, ``policy``), counted once kept. A dry run's audit record says that
        nothing was kept."""
        if self.dry_run:
            self.request.state.audit_detail = "dry run: nothing saved"
            report = preview(uow, default_table=runtime(self.request).settings.default_table,
                             sessions=sessions_of(self.request))
            return JSONResponse({"dry_run": True, "would_be": document, "impact": report.as_list(),
                                 "sessions": report.sessions_list()})
        if revised is not None:
            count_revision(self.request, revised)
        return document  # committed, its event reaches the leading replica's rekeyer (app.services.rekey)


def get_edit(request: Request, dry_run: Annotated[bool, Query(
        description="make nothing: answer what the edit would make and which running tunnels it would "
                    "leave below their minimums (noncompliant), give a cheaper or different choice, or leave as "
                    "they are")] = False) -> Edit:
    return Edit(dry_run, request)


EditDep = Annotated[Edit, Depends(get_edit)]
