"""What follows an edit of a rating table or a policy: with ``?dry_run=true`` the edit is made,
its impact on the running tunnels assessed, and all of it rolled back; otherwise, once it has
committed, the tunnels it concerns are negotiated again in the background
(:mod:`app.services.rekey`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import BackgroundTasks, Depends, Query, Request
from fastapi.responses import JSONResponse

from app.services.ports import NO_METRICS, Metrics, UnitOfWork
from app.services.rekey import assess
from app.settings import Settings

__all__ = ["Edit", "EditDep", "count_revision"]

#: What an edit's ``cause`` starts with -> the ``kind`` label of ``qoss_revisions_total``.
_REVISED = (("rating table ", "rating_table"), ("policy ", "policy"))


def count_revision(request: Request, kind: str) -> None:
    """Count one new revision of a ``rating_table`` or a ``policy`` (``qoss_revisions_total``)."""
    metrics: Metrics = getattr(request.app.state, "metrics", NO_METRICS)
    metrics.count("qoss_revisions_total", kind=kind)


@dataclass
class Edit:
    """The edit's mode (``dry_run``) and what to do once it is made."""

    dry_run: bool
    request: Request
    background: BackgroundTasks

    def finish(self, uow: UnitOfWork, cause: str, document: dict[str, Any]) -> Any:
        """The answer of an edit made in ``uow``: the document, or with ``dry_run`` the document
        it would have made and its impact on every running tunnel, nothing kept."""
        if self.dry_run:
            settings: Settings = self.request.app.state.settings
            impact = [i.as_dict() for i in assess(uow, default_table=settings.default_table)]
            uow.rollback()
            return JSONResponse({"dry_run": True, "would_be": document, "impact": impact})
        for prefix, kind in _REVISED:
            if cause.startswith(prefix):
                count_revision(self.request, kind)
        rekeyer = getattr(self.request.app.state, "rekeyer", None)
        if rekeyer is not None:  # runs after the answer, so after the request's unit of work committed
            self.background.add_task(rekeyer.schedule, cause)
        return document


def get_edit(request: Request, background: BackgroundTasks, dry_run: Annotated[bool, Query(
        description="make nothing: answer what the edit would make and which running tunnels it would "
                    "leave below their minimums (noncompliant), give a cheaper or different choice, or leave as "
                    "they are")] = False) -> Edit:
    return Edit(dry_run, request, background)


EditDep = Annotated[Edit, Depends(get_edit)]
